"""The import rules of servetune's packages (search/__init__.py states them): no import circle anywhere in
search/, spaces/, runners/; the parts of search/ import one way; nothing outside search/cli/ imports first-party
code inside a function. Every import counts: module level, inside functions, under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("search", "spaces", "runners")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def edges(known: dict[str, Path]) -> Iterator[Edge]:
    """Every first-party import of every module, resolved to the module it loads."""
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        inner = {id(sub) for fn in functions for sub in ast.walk(fn)}
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = _resolve(target, known)
                if resolved is None or resolved == name:
                    continue
                # ``import a.b`` of one's own package __init__ is not an edge back to it.
                if known[resolved].name == "__init__.py" and name.startswith(resolved + "."):
                    continue
                yield Edge(name, resolved, node.lineno, id(node) in inner)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


#: The parts of search/ and the parts each may import (besides itself and the leaf modules). A part is
#: ``search.<part>``; ``trial.records`` names one module of a part.
LEAVES = {"search._optuna_compat", "search.files", "search.settings", "search.storage", "search.spaces"}
ALLOWED = {
    "search.trial": set(),
    "search.strategy": {"search.trial.records"},
    "search.driver": {"search.trial", "search.strategy"},
    "search.outputs": {"search.trial.records", "search.strategy"},
    "search.api": {"search.driver", "search.trial", "search.strategy", "search.outputs"},
    "search.cli": {"search.api", "search.driver", "search.trial", "search.strategy", "search.outputs"},
    "search": {"search.api", "search.driver"},  # the package's lazy exports
    "search.__main__": {"search.cli"},
}


def part_of(module: str) -> str:
    if module in LEAVES or module in ("search", "search.__main__", "search.api"):
        return module
    return ".".join(module.split(".")[:2])


def allowed(source: str, target: str) -> bool:
    if not target.startswith("search"):
        return True
    if target in LEAVES:
        return True
    src, dst = part_of(source), part_of(target)
    if src in LEAVES:
        return dst in LEAVES
    if src == dst:
        return True
    rules = ALLOWED[src]
    return dst in rules or any(target == rule or target.startswith(rule + ".") for rule in rules)


@pytest.fixture(scope="module")
def graph_edges() -> list[Edge]:
    return list(edges(modules()))


def test_no_import_circle_in_search_spaces_runners(graph_edges: list[Edge]) -> None:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for edge in graph_edges:
        graph[edge.source].add(edge.target)
    assert circles(graph) == []


def test_the_parts_of_search_import_one_way(graph_edges: list[Edge]) -> None:
    broken = [f"{e.source} imports {e.target} (line {e.line})" for e in graph_edges
              if e.source.startswith("search") and not allowed(e.source, e.target)]
    assert broken == []


def test_outer_packages_never_import_inward(graph_edges: list[Edge]) -> None:
    """runners/ imports neither search/ nor spaces/; spaces/ imports no search/ and of runners/ only the one
    exception tree (``runners.errors``)."""
    broken = [f"{e.source} imports {e.target}" for e in graph_edges
              if (e.source.startswith("runners") and not e.target.startswith("runners"))
              or (e.source.startswith("spaces") and not e.target.startswith(("spaces", "runners.errors")))]
    assert broken == []


def test_nothing_outside_the_cli_imports_first_party_code_inside_a_function(graph_edges: list[Edge]) -> None:
    inner = [f"{e.source}:{e.line} imports {e.target}" for e in graph_edges
             if e.in_function and e.source.startswith("search") and not e.source.startswith("search.cli")]
    assert inner == []


def test_the_rules_are_the_ones_the_package_states() -> None:
    """search/__init__.py's docstring states these rules; a rule changed here must change there too."""
    doc = ast.get_docstring(ast.parse((ROOT / "search" / "__init__.py").read_text())) or ""
    for part in ALLOWED:
        if part.startswith("search.") and part != "search.__main__":
            assert f"``{part.removeprefix('search.')}``" in doc, part
    for leaf in LEAVES:
        assert f"``{leaf.removeprefix('search.')}``" in doc, leaf
    assert "no import circle" in doc


def test_the_checker_catches_a_circle_and_a_broken_rule() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert not allowed("search.strategy.design", "search.trial.objective")
    assert allowed("search.strategy.design", "search.trial.records")
    assert not allowed("search.outputs.report", "search.driver.run")
    assert not allowed("search.storage", "search.trial.records")
    assert allowed("search.cli.commands", "search.driver.run")


# ---- Optuna's private names: reached in search/_optuna_compat.py only ----------------------------------------

#: The one module that may reach Optuna's private attributes (its docstring says why each is needed).
COMPAT = "search._optuna_compat"
#: Third-party packages whose private names are fenced in :data:`COMPAT`.
FENCED = ("optuna", "optuna_dashboard")


def optuna_private_names() -> set[str]:
    """Every private name Optuna defines: its private functions, methods and classes, and the private attributes
    its classes assign (``self._x = ...``), read from its installed source."""
    import optuna

    names: set[str] = set()
    for path in Path(optuna.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = None
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            if name is not None and name.startswith("_") and not name.startswith("__"):
                names.add(name)
    return names


def private_reaches(tree: ast.AST, private: set[str]) -> Iterator[tuple[int, str]]:
    """(line, what) for each reach into Optuna's privates in ``tree``: an import from a private module (or of a
    private name) of :data:`FENCED`, an attribute of Optuna's private name on anything but ``self``/``cls``, or
    such a name as a string (``getattr(storage, "_get_trials")``)."""
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] in FENCED and any(p.startswith("_") for p in parts[1:]):
                yield node.lineno, f"imports {module}"
        if isinstance(node, ast.Attribute) and node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            yield node.lineno, f"reaches .{node.attr}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in private:
            yield node.lineno, f"names {node.value!r}"


def test_optunas_private_names_are_reached_in_one_place() -> None:
    """Optuna's private attributes and modules are reached in :data:`COMPAT` only, whose functions say what they
    rely on and whose test (``tests/search/test_optuna_compat.py``) pins it; anywhere else an Optuna upgrade
    would break a search silently."""
    private = optuna_private_names()
    assert {"_get_trials", "_study_id", "_trial_id", "_storage"} <= private, "Optuna's source reads differently"
    found = [f"{name}:{line} {what}" for name, path in modules().items()
             if name.startswith("search") and name != COMPAT  # runners/ and spaces/ import no Optuna
             for line, what in private_reaches(ast.parse(path.read_text(), filename=str(path)), private)]
    assert found == [], f"reach Optuna's privates through {COMPAT} instead"


def test_the_private_name_checker_catches_each_kind_of_reach() -> None:
    private = {"_get_trials", "_study_id"}
    code = ("from optuna.artifacts._protocol import ArtifactStore\nimport optuna.study._frozen\n"
            "sid = study._study_id\nfn = getattr(storage, '_get_trials')\nmine = self._study_id\n"
            "from optuna.trial import FrozenTrial\n")
    assert [line for line, _ in private_reaches(ast.parse(code), private)] == [1, 2, 3, 4]
