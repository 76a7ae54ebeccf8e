"""Issue 22: a pipeline's run of single-id XACKs to one queue is worked as one request
(commands/runs.py ack_run, Tasks.ack). Each XACK must answer what it would have answered
sent alone, one after another: 1 for a task it finished, 0 for one done already, repeated, never
pushed or of another queue, its error for an id XACK refuses; and the queue's counts move the same.
Each test sends the same commands pipelined to one queue and one at a time to its twin."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError
from support_queue import claim, configure, pending, queue_figures


def ready(r, queue, tasks):
    """`tasks` pushed and claimed by w1; their ids."""
    r.xgroup_create(queue, "g", id="0", mkstream=True)
    ids = [r.xadd(queue, {"n": str(n)}) for n in range(tasks)]
    assert [task_id for task_id, _ in claim(r, queue, count=tasks)] == ids
    return [task_id.decode() if isinstance(task_id, bytes) else task_id for task_id in ids]


def replies(r, commands, pipelined):
    if not pipelined:
        out = []
        for command in commands:
            try:
                out.append(r.execute_command(*command))
            except ResponseError as exc:
                out.append(f"error: {exc}")
        return out
    pipe = r.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return [f"error: {reply}" if isinstance(reply, ResponseError) else reply
            for reply in pipe.execute(raise_on_error=False)]


def both_ways(r, queue, make_commands, tasks=20, settings=()):
    """The replies, pending ids and figures of `make_commands(queue, ids)` pipelined to `queue`
    and sent one at a time to its twin; asserts they agree and returns the pipelined replies."""
    results = []
    for name, pipelined in ((queue, True), (queue + "-twin", False)):
        if settings:
            configure(r, name, *settings)
        ids = ready(r, name, tasks)
        got = replies(r, make_commands(name, ids), pipelined)
        figures = {key: value for key, value in queue_figures(r, name).items()
                   if key in ("available", "in_flight", "done", "acked", "length")}
        assert {"in_flight", "done", "acked"} <= set(figures), figures
        held = [ids.index(entry["message_id"].decode()) for entry in pending(r, name)]  # by position
        results.append((got, held, figures))
    assert results[0] == results[1]
    return results[0][0]


def test_pipelined_acks_of_held_tasks_answer_one_each(r, queue):
    got = both_ways(r, queue, lambda q, ids: [("XACK", q, "g", task_id) for task_id in ids])
    assert got == [1] * 20


@pytest.mark.parametrize("run", [3, 8, 50])
def test_pipelined_acks_count_each_task_for_the_first_ack_that_finishes_it(r, queue, run):
    """Runs short of one statement, at it and past it: a repeated id, a never-pushed id and an id
    acked before the run each answer 0 (the batched statement is undone and each goes alone)."""
    def commands(q, ids):
        held = ids[1:run - 2] if run > 3 else ids[1:2]
        sent = [ids[0]] + held + [ids[1], "99999999999999-0", ids[0]]
        return [("XACK", q, "g", ids[0])] + [("XACK", q, "g", task_id) for task_id in sent]
    got = both_ways(r, queue, commands, tasks=max(run, 4))
    assert got[0] == 1 and got[1] == 0 and got[-3:] == [0, 0, 0] and set(got[2:-3]) == {1}


def test_a_run_ends_where_a_command_is_not_a_plain_ack_of_the_queue(r, queue):
    """Spellings, another queue, a bad id, two ids, a group XACK ignores, the dead view."""
    def commands(q, ids):
        return [("XACK", q, "g", ids[0]), ("xack", q, "g", ids[1]), ("XaCk", q, "g", ids[2]),
                ("XACK", q, "g", "not-an-id"), ("XACK", q, "g", ids[3]), ("XACK", q + "-other", "g", ids[4]),
                ("XACK", q, "g", ids[4], ids[5]), ("XACK", q, "other-group", ids[6]),
                ("XACK", q + "::dead", "g", ids[7]), ("XACK", q, "g", ids[7]), ("XACK", q, "g", ids[8]),
                ("XACK", q, "g", "18446744073709551616-0"), ("XACK", q, "g", ids[9])]
    got = both_ways(r, queue, commands, tasks=10)
    assert got[:3] == [1, 1, 1] and got[3].startswith("error: ") and got[4:6] == [1, 0]
    assert got[6:8] == [2, 1] and got[8:11] == [0, 1, 1] and got[11].startswith("error: ") and got[12] == 1


def test_pipelined_acks_under_retention_zero_delete_each_task(r, queue):
    got = both_ways(r, queue, lambda q, ids: [("XACK", q, "g", task_id) for task_id in ids + ids[:2]],
                    tasks=12, settings=("RETENTION", "0"))
    assert got == [1] * 12 + [0, 0]
    assert r.xlen(queue) == 0


def test_pipelined_acks_inside_multi_are_queued_and_answer_at_exec(r, queue):
    ids = ready(r, queue, 5)
    pipe = r.pipeline(transaction=True)
    for task_id in ids + ids[:1]:
        pipe.xack(queue, "g", task_id)
    assert pipe.execute() == [1] * 5 + [0]
    assert pending(r, queue) == []


def test_acks_of_one_queue_in_one_pipeline_are_one_request(ezra_factory):
    """20 pipelined XACKs of one id each: one writer request (20 before: a Request and a statement each)."""
    client = ezra_factory().client(2)
    used = []
    for round_ in range(3):  # the reaper commits a pass of its own now and then: the least of three counts
        ids = ready(client, f"q{round_}", 20)
        before = client.info("persistence")["committed_requests"]
        pipe = client.pipeline(transaction=False)
        for task_id in ids:
            pipe.xack(f"q{round_}", "g", task_id)
        assert pipe.execute() == [1] * 20
        used.append(client.info("persistence")["committed_requests"] - before)
    assert min(used) == 1, f"20 pipelined acks took {used} requests"
