"""spaces/ describes what to try: it imports nothing from runners/ but runners.errors, and nothing from search/."""

from __future__ import annotations

import ast
from pathlib import Path

SPACES = Path(__file__).resolve().parents[2] / "spaces"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_spaces_import_only_runners_errors() -> None:
    modules = sorted(SPACES.glob("*.py"))
    assert modules
    for module in modules:
        ours = {n for n in _imports(module) if n.split(".")[0] in ("runners", "search")}
        assert ours <= {"runners.errors"}, f"{module.name} imports {sorted(ours - {'runners.errors'})}"
