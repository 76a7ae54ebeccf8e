"""The README's Python example works when pasted (against a real server)."""

from __future__ import annotations

import re
import subprocess
import sys

from support_servers import ROOT


def readme_python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_example_runs(ezra_factory):
    server = ezra_factory()
    [example] = [block for block in readme_python_blocks() if "xreadgroup" in block]
    code = example.replace("port=42002", f"port={server.port}")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "sending" in result.stdout
    client = server.client()
    assert client.xlen("emails") == 0, "the example acked its task"
    assert client.xpending("emails", "g")["pending"] == 0


def test_readme_first_lines_are_the_setup_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    block = lines[lines.index("```sh") + 1:lines.index("```sh") + 3]
    assert block[0].startswith("pip install . && ezra")
    assert block[1].startswith("./scripts/test.sh")
    assert (ROOT / ".ci" / "run").read_text().count("scripts/test.sh") == 1


def test_readme_is_a_front_door_with_the_example_on_its_first_screen():
    """Issue 48: at most 250 lines, the producer+worker block within the first 80."""
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    example_end = next(i for i, line in enumerate(lines) if "r.xreadgroup(" in line)
    assert example_end < 80, example_end


def test_readme_links_lead_to_files_that_exist():
    text = (ROOT / "README.md").read_text()
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)]+)\)", text)
               if not target.startswith(("http", "#"))]
    assert len(targets) > 20
    missing = sorted({target for target in targets if not (ROOT / target).exists()})
    assert missing == [], missing
