"""The docs: the README stays a short front page, and the reference hook renders what the code holds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import typer
import typer.main
from mkdocs.exceptions import PluginError
from pydantic import BaseModel

from runners.diagnose import diagnose_file, render_text
from search.cli import app
from spaces.schema import Budget, Knobs, Space, Workload

ROOT = Path(__file__).resolve().parent.parent


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _hook()


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    seen.add(model)
    for field in model.model_fields.values():
        for sub, _ in hook._models_in(field.annotation):
            if sub not in seen:
                _models(sub, seen)


def test_readme_is_a_short_front_page_with_two_commands_for_a_fresh_machine() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    install = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", install, re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)", text) if "://" not in t]
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def test_space_reference_lists_every_key_of_every_model_it_reaches() -> None:
    text = hook.schema_markdown("spaces.schema:Space")
    models: set[type[BaseModel]] = set()
    _models(Space, models)
    assert {Knobs, Workload, Budget} <= models
    for model in models:
        for name in model.model_fields:
            assert f"| `{name}` |" in text, f"{model.__name__}.{name} missing"


def test_space_reference_takes_types_bounds_defaults_and_docstrings_from_the_code() -> None:
    text = hook.schema_markdown("spaces.schema:Space")
    rows: dict[str, str] = {}  # the first table with a key (the top level's `port`, not deploy's)
    for line in text.splitlines():
        if line.startswith("| `"):
            rows.setdefault(line.split(" | ")[0].strip("| `"), line)
    assert "duration (`90s`, `15m`, `8h`, or seconds) or `null`" in rows["timeout"]
    assert "integer ≥ 1024, ≤ 65535" in rows["port"] and "`30000`" in rows["port"]
    assert "`--mem-fraction-static`" in rows["mem_fraction_static"]
    assert "`VLLM_CPU_KVCACHE_SPACE`" in rows["kv_cache_space_gib"]
    # The docstring under the field, with its reStructuredText literals as Markdown.
    assert "`[len * range_ratio, len]`" in rows["range_ratio"]
    assert "| required |" in rows["model_path"]


def test_attribute_docstrings_are_the_strings_under_each_field() -> None:
    class Sample(BaseModel):
        documented: int = 1
        """Says what it is."""
        bare: int = 2
        also: str = ""
        """The ``also`` key."""

    assert hook.attribute_docstrings(Sample) == {"documented": "Says what it is.", "also": "The ``also`` key."}


def test_cli_reference_has_every_command_of_the_app() -> None:
    text = hook.cli_markdown("search.cli:app")
    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    names = group.list_commands(ctx)  # type: ignore[attr-defined]
    assert {"run", "worker", "validate", "export", "diagnose", "hosts"} <= set(names)
    for name in names:
        assert f"## `servetune {name}`" in text
    assert "### `servetune hosts check`" in text
    assert "--confirm-final" in text


def test_space_marker_refuses_a_file_that_does_not_load(tmp_path: Path) -> None:
    assert "name: demo-sim-dsv4" in hook.space_markdown("spaces/demo-sim.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(PluginError, match="does not load"):
        hook.space_markdown(str(bad))  # an absolute path stays itself under the repository root


@pytest.mark.parametrize("marker, message", [
    ("<!-- generated: nonsense spaces.schema:Space -->", "unknown marker kind"),
    ("<!-- generated: schema spaces.schema:Missing -->", "cannot load"),
    ("<!-- generated: schema -->", "malformed marker"),
    ("<!-- generated: diagnose tests/data/logs/no-such.log -->", "diagnose"),
])
def test_a_bad_marker_fails_the_build(marker: str, message: str) -> None:
    with pytest.raises(PluginError, match=message):
        hook.on_page_markdown(f"# Page\n\n{marker}\n")


def test_diagnose_marker_prints_what_the_command_prints() -> None:
    block = hook.diagnose_markdown("tests/data/logs/sim-capture-oom.log@server.log")
    expected = render_text(diagnose_file(ROOT / "tests/data/logs/sim-capture-oom.log"), source="server.log")
    assert block == f"```console\n$ servetune diagnose server.log\n{expected.rstrip()}\n```\n"
    assert "outcome  oom" in block


def test_a_page_without_markers_is_left_alone() -> None:
    page = "# Page\n\nNo generated text here.\n"
    assert hook.on_page_markdown(page) == page


# A citation in code names a document by its file name (``sglang-facts §3``, ``engine-audit item 9``) or by a path;
# either must be a file of this repository.
CITED_NOTES = {"sglang-facts": "sglang-facts.md", "engine-audit": "engine-audit.md", "vllm-cpu-notes": "vllm-cpu-notes.md"}


def test_code_cites_only_documents_in_the_repository() -> None:
    sources = ROOT / "docs" / "sources"
    for name in CITED_NOTES.values():
        assert (sources / name).is_file(), name
    outside = re.compile(r"(?<![\w/])(\.\./)*shared/(reference|seeds)\b")
    for top in ("search", "spaces", "runners", "benchmarks", "tests", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in {".py", ".sh", ".yaml", ".md", ".json"} or "sources" in path.parts:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            assert not outside.search(text), f"{path.relative_to(ROOT)} cites a document outside the repository"
    for seed in ("000", "001", "002", "003"):
        assert list((sources / "seeds").glob(f"{seed}_*.txt")), seed
