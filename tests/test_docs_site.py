"""The docs site builds with `mkdocs build --strict` (issue 48): no broken link or anchor, no
page left out of mkdocs.yml's nav. scripts/test.sh builds it too, into build/site."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from support_servers import ROOT


def test_the_site_builds_strict(tmp_path):
    pytest.importorskip("material", reason="pip install '.[docs]' (mkdocs-material)")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "guides" / "dead-queue" / "index.html").is_file()


def test_the_nav_has_the_issues_sections_and_every_page():
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    sections = [next(iter(entry)) for entry in config["nav"]]
    assert sections == ["Home", "Getting started", "Guides by task", "Frameworks", "Operations", "Reference", "Internals"]

    def pages(nav):
        for entry in nav:
            value = next(iter(entry.values()))
            yield from pages(value) if isinstance(value, list) else [value]
    listed = set(pages(config["nav"]))
    on_disk = {str(path.relative_to(ROOT / "docs")) for path in (ROOT / "docs").rglob("*.md")} - {"README.md"}
    assert listed == on_disk


def fragments(text: str) -> list[str]:
    """Prose lines that start in lower case right after a line that ended a sentence: the tail
    of a sentence whose start was edited away (docs/dramatiq.md ended in one)."""
    found, fence, previous = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fence, previous = not fence, ""
            continue
        if fence or line.startswith(("|", "#")):
            previous = ""
            continue
        end = previous.rstrip()
        if end.endswith(".") and not end.endswith("..") and re.match(r"[a-z]", line) \
                and not re.search(r"\b(e\.g|i\.e|etc|vs)\.$", end):
            found.append(line)
        previous = line
    return found


def test_no_page_has_a_sentence_fragment():
    assert fragments("The runs were interleaved.\nthe same evening, so the gap is the server's.\n"), "control"
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    found = {str(page.relative_to(ROOT)): fragments(page.read_text()) for page in pages}
    assert {page: lines for page, lines in found.items() if lines} == {}
