"""The test suite's own rules: helpers that several test modules share live in support_*.py
(by topic; fixtures in conftest.py), so no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


def test_no_test_module_imports_another():
    test_modules = {path.stem for path in TESTS.glob("test_*.py")}
    assert len(test_modules) > 30
    offenders = {path.name: sorted(imported_modules(path) & test_modules)
                 for path in sorted(TESTS.rglob("*.py"))}
    assert {name: found for name, found in offenders.items() if found} == {}, \
        "move the shared helpers to tests/support_*.py"


def test_no_module_imports_helpers_from_conftest():
    """conftest.py holds fixtures, which pytest hands to tests by name: a module importing from
    it is reaching for a helper, and those live in support_*.py (28 modules did before)."""
    offenders = sorted(path.relative_to(TESTS).as_posix() for path in TESTS.rglob("*.py")
                       if "conftest" in imported_modules(path))
    assert offenders == [], "import helpers from support_*.py, not conftest.py"
