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
