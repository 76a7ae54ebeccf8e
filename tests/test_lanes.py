"""The claim order of a queue with priorities and partitions (broker/lanes.py), as a plain object:
priority first, partitions in turn within one, push order within a partition, a partition's
tasks in flight held to the limit."""

from __future__ import annotations

from ezra.broker.lanes import NO_PARTITION, Lanes


def test_the_most_urgent_priority_goes_first_and_push_order_within_one():
    lanes = Lanes()
    for rowid, priority in [(1, 5), (2, 0), (3, 9), (4, 0), (5, 5)]:
        lanes.add(rowid, priority, NO_PARTITION)
    assert len(lanes) == 5
    assert lanes.take(10) == [2, 4, 1, 5, 3]
    assert len(lanes) == 0 and lanes.take(1) == []


def test_a_task_that_comes_back_keeps_its_place_by_push_order():
    lanes = Lanes(partition_limit=3)
    for rowid in (1, 2, 3):
        lanes.add(rowid, 5, b"a")
    assert lanes.take(1) == [1]
    assert lanes.ended(1) == (5, b"a")  # a nack: where it goes again
    lanes.add(1, 5, b"a")
    assert lanes.take(3) == [1, 2, 3]


def test_partitions_take_turns_so_a_long_one_delays_no_other_partitions_first_task():
    lanes = Lanes(partition_limit=100)
    rowid = 0
    for _ in range(100_000):  # one partition with 100,000 queued first...
        rowid += 1
        lanes.add(rowid, 5, b"big")
    others = []
    for n in range(50):  # ...then 50 partitions with 10 each
        for _ in range(10):
            rowid += 1
            lanes.add(rowid, 5, b"p%d" % n)
            others.append(rowid)
    first_claims = lanes.take(100)
    firsts = {others[n * 10] for n in range(50)}
    assert firsts <= set(first_claims), "every partition's first task within the first 100 claims"
    # in push order alone the first 100 claims would all be the big partition's; in turns it had
    # one a round: the first (itself and the 50 others), and the second
    assert [rowid for rowid in first_claims if rowid <= 100_000] == [1, 2]


def test_a_partition_has_at_most_the_limit_in_flight_and_gets_room_back_when_one_ends():
    lanes = Lanes(partition_limit=1)
    for rowid in (1, 2, 3):
        lanes.add(rowid, 5, b"a")
    assert lanes.take(3) == [1]  # one at a time: the partition's tasks run one after another
    assert lanes.take(3) == []
    lanes.ended(1)  # acked
    assert lanes.take(3) == [2]
    lanes.not_claimed([2])  # the claim's write found it gone (a stale entry)
    assert lanes.take(3) == [3]


def test_tasks_without_a_partition_are_not_limited_and_take_a_turn_like_one():
    lanes = Lanes(partition_limit=1)
    for rowid in (1, 2, 3):
        lanes.add(rowid, 5, NO_PARTITION)
    for rowid in (4, 5):
        lanes.add(rowid, 5, b"a")
    assert lanes.take(5) == [1, 4, 2, 3]  # a's second waits for its first to end


def test_a_higher_limit_lets_waiting_partitions_back_in():
    lanes = Lanes(partition_limit=1)
    for rowid in (1, 2, 3):
        lanes.add(rowid, 5, b"a")
    assert lanes.take(3) == [1]
    lanes.set_partition_limit(3)
    assert lanes.take(3) == [2, 3]


def test_idle_partitions_leave_nothing_behind():
    lanes = Lanes(partition_limit=2)
    for n in range(1000):
        lanes.add(n, n % 10, b"key-%d" % n)
    taken = lanes.take(1000)
    assert sorted(taken) == list(range(1000))
    assert any(level and level.lanes for level in lanes.levels)  # the control: held while in flight
    for rowid in taken:
        lanes.ended(rowid)
    assert not lanes.holding and all(level is None or not level.lanes for level in lanes.levels)


def test_forgotten_tasks_at_a_lanes_head_go_and_the_rest_are_stepped_over():
    lanes = Lanes(partition_limit=5)
    for rowid in (1, 2, 3):
        lanes.add(rowid, 0, b"a")
    lanes.add(4, 5, NO_PARTITION)
    assert lanes.head() == 1
    lanes.forget([(1, 0, b"a"), (2, 0, b"a")])
    assert lanes.head() == 3 and len(lanes) == 2
    assert lanes.take(5) == [3, 4]
    assert lanes.partitions_with_work() == 0


def test_a_partition_s_limit_counts_its_tasks_at_every_priority():
    lanes = Lanes()  # limit 1
    lanes.add(1, 7, b"a")
    lanes.add(2, 5, b"b")
    lanes.add(3, 0, b"a")
    assert lanes.take(10) == [3, 2]  # a's priority 7 task waits: a has one in flight (at priority 0)
    assert not lanes.ready()
    assert lanes.ended(3) == (0, b"a")
    assert lanes.ready() and lanes.take(10) == [1]


def test_lanes_built_from_the_file_s_rows_hold_what_is_in_flight():
    available = [(2, None, "a"), (3, 0, None), (4, 2, b"b"), (5, 5, "a"), (6, None, None), (7, 5, None)]
    lanes = Lanes.from_rows(available, [(1, None, "a")], partition_limit=1)
    assert len(lanes) == 6 and lanes.holding == {1: (5, b"a")}
    assert lanes.take(10) == [3, 4, 6, 7]  # a is at its limit (1 in flight); NULL is priority 5
    assert lanes.ended(1) == (5, b"a")
    assert lanes.take(10) == [2]
    assert lanes.ended(2) == (5, b"a") and lanes.take(10) == [5]


def test_a_plain_order_turns_into_the_default_lane_as_it_is():
    from ezra.broker.available import AvailableOrder
    lanes = Lanes.from_order(AvailableOrder([10, 11, 12]), [9])
    lanes.add(13, 0, b"x")
    assert lanes.take(2) == [13, 10]
    assert lanes.ended(9) == (5, NO_PARTITION)
    assert lanes.take(5) == [11, 12]


def test_a_second_entry_of_a_task_handed_out_is_stepped_over():
    lanes = Lanes()
    lanes.add(1, 5, b"a")
    lanes.add(1, 5, NO_PARTITION)  # XNACK FORCE of a task nobody held: a second entry
    assert lanes.take(10) == [1]
    assert lanes.take(10) == [] and lanes.holding == {1: (5, b"a")}
