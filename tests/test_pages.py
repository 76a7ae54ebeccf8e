"""scripts/pages.py, the pages each state change writes (BENCHMARKS.md, "Budget per command").

A smoke run with tiny counts so the measurement cannot rot: its variants are edits of
ezra/storage/schema.sql, and a schema change that leaves one of them with nothing to edit
must stop the script rather than measure the unchanged schema under a variant's name. No
timing is asserted; the WAL frames are counts, and what they show holds at any size: the
partial index tasks_available (schema 7's, dropped by schema 8) is one B-tree (one frame) of
every push and every claim, none of an ack; tasks_in_flight (schema 11's, dropped by schema 12)
one of every claim and every ack, none of a push.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_pages(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/pages.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def frames_table(stdout: str) -> dict[str, dict[str, float]]:
    """{variant: {phase: WAL frames per command}} from the script's markdown table."""
    table = {}
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"[\d.]+ / [\d.]+", cells[1]):
            table[cells[0]] = {phase: float(cell.split(" / ")[0])
                               for phase, cell in zip(("push", "claim", "ack"), cells[1:])}
    return table


def test_every_variant_runs_and_each_dropped_index_is_a_frame_of_the_moves_it_holds():
    proc = run_pages("--tasks", "40", "--backlog", "200", "--rounds", "1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = frames_table(proc.stdout)
    assert set(table) == {"base", "without_rowid", "with_available_index", "without_rowid + with_available_index",
                          "with_in_flight_index", "primary_key", "integer_queue", "no_auto_vacuum"}, proc.stdout
    no_index, with_index = table["base"], table["with_available_index"]
    assert all(frames >= 1 for frames in no_index.values()), table
    assert with_index["push"] - no_index["push"] >= 0.8, table
    assert with_index["claim"] - no_index["claim"] >= 0.8, table
    assert with_index["ack"] == no_index["ack"], table
    with_index = table["with_in_flight_index"]
    assert with_index["push"] == no_index["push"], table
    assert with_index["claim"] - no_index["claim"] >= 0.8, table
    assert with_index["ack"] - no_index["ack"] >= 0.8, table
    assert table["primary_key"]["push"] > no_index["push"], table  # schema 13's key index: pushes wrote it


def test_the_start_up_rebuild_reads_every_available_task_in_order():
    proc = run_pages("--rebuild", "2000")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert re.search(r"^2000 available of 2500 tasks: head \(1000000000001, 0\)", proc.stdout, re.M), proc.stdout
