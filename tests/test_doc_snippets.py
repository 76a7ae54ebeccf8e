"""The Python blocks of the README, docs/getting-started.md and docs/guides/ run, each as pasted,
against a real server (issue 48): the docs cannot drift from the code.

A block runs with `port=42002` pointed at a fresh server. Its first line may say how:
`# server: --password s3cret` starts that server with those flags; `# not run: why` leaves
the block out (a positive control below checks that most blocks do run).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest

from support_servers import ROOT

PAGES = [ROOT / "README.md", ROOT / "docs" / "getting-started.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def python_blocks() -> list[tuple[str, str]]:
    """(page:line, code) of each ```python block of the pages."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


BLOCKS = python_blocks()
RUN = [(where, code) for where, code in BLOCKS if not code.startswith("# not run")]


def test_most_blocks_run_and_each_page_with_a_guide_has_one():
    assert len(BLOCKS) >= 12 and len(RUN) >= len(BLOCKS) - 2, [where for where, _ in BLOCKS]
    assert any(where.startswith("README.md") and "DELAY" in code for where, code in RUN)
    for where, code in RUN:
        assert "port=42002" in code, f"{where}: a block that runs names EZRA's port"


@pytest.mark.parametrize("where,code", RUN, ids=[where for where, _ in RUN])
def test_block_runs_against_a_real_server(ezra_factory, where, code):
    first = code.splitlines()[0]
    flags = shlex.split(first.removeprefix("# server:")) if first.startswith("# server:") else []
    server = ezra_factory(*flags)
    program = code.replace("port=42002", f"port={server.port}")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{where}:\n{result.stderr}"
