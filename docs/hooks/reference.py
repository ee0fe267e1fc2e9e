"""MkDocs hook: the reference pages' tables, made from the code at build time so they cannot drift from it.

A page asks for generated text with a marker on a line of its own; the hook replaces the marker:

* ``<!-- generated: schema MODULE:CLASS -->``: one table per pydantic model reachable from CLASS (key, type,
  default, description from the field's ``description`` or the docstring under it);
* ``<!-- generated: cli MODULE:APP -->``: the Typer app's commands, by Typer's own Markdown renderer (what
  ``typer MODULE utils docs`` prints, so the page says what ``--help`` says);
* ``<!-- generated: space FILE -->``: a shipped space file, verbatim, after checking that it loads;
* ``<!-- generated: diagnose LOG@SHOWN -->``: what ``servetune diagnose SHOWN`` prints for the log file LOG.

An unknown marker, or a model, app or file that is not there, fails the build.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types
from mkdocs.exceptions import PluginError
from pydantic import BaseModel
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[2]
_MARKER = re.compile(r"^<!-- generated: (\w+) (\S+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: replace every marker of the page with its generated Markdown."""
    if "<!-- generated:" not in markdown:
        return markdown
    for line in markdown.splitlines():
        if line.startswith("<!-- generated:") and not _MARKER.fullmatch(line):
            raise PluginError(f"reference hook: malformed marker {line!r}; write <!-- generated: KIND ARG -->")
    return _MARKER.sub(lambda m: _generate(m.group(1), m.group(2)), markdown)


def _generate(kind: str, arg: str) -> str:
    generators: dict[str, Callable[[str], str]] = {"schema": schema_markdown, "cli": cli_markdown,
                                                   "space": space_markdown, "diagnose": diagnose_markdown}
    if kind not in generators:
        raise PluginError(f"reference hook: unknown marker kind {kind!r}; allowed: {', '.join(generators)}")
    return generators[kind](arg)


def _load(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"reference hook: cannot load {target}: {exc}") from None


# ---- the space file and the inventory: pydantic models ---------------------------------------------------


def schema_markdown(target: str) -> str:
    """Tables for the model ``MODULE:CLASS`` and every model its fields hold, in the order first reached."""
    root = _load(target)
    if not (inspect.isclass(root) and issubclass(root, BaseModel)):
        raise PluginError(f"reference hook: {target} is not a pydantic model")
    models = _reachable(root)
    prefix = root.__name__.lower()
    anchors = {model: _anchor(prefix, paths[0]) for model, paths in models.items()}
    parts = []
    for model, paths in models.items():
        # The root's table goes under the page's own heading; each nested model gets one naming its keys.
        if model is not root:
            parts.append(f"### `{paths[0]}` {{#{anchors[model]}}}\n")
            if len(paths) > 1:
                parts.append("The same keys at " + ", ".join(f"`{p}`" for p in paths[1:]) + ".\n")
        if "__doc__" in model.__dict__ and model.__doc__:
            parts.append(_rst_to_md(inspect.getdoc(model) or "") + "\n")
        parts.append(_model_table(model, anchors))
    return "\n".join(parts)


def _reachable(root: type[BaseModel]) -> dict[type[BaseModel], list[str]]:
    """Each model reachable from ``root`` -> the key paths it is found at (``""`` for the root)."""
    found: dict[type[BaseModel], list[str]] = {root: [""]}
    queue: list[tuple[type[BaseModel], str]] = [(root, "")]
    while queue:
        model, path = queue.pop(0)
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            for sub, many in _models_in(field.annotation):
                sub_path = f"{key}[]" if many else key
                if sub in found:
                    found[sub].append(sub_path)
                else:
                    found[sub] = [sub_path]
                    queue.append((sub, sub_path))
    return found


def _models_in(annotation: Any, many: bool = False) -> Iterator[tuple[type[BaseModel], bool]]:
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        yield annotation, many
        return
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        if origin is typing.Annotated and not _is_type(arg):
            continue
        yield from _models_in(arg, many or origin in (list, tuple, set, frozenset))


def _is_type(value: Any) -> bool:
    return inspect.isclass(value) or typing.get_origin(value) is not None or value is None


def _anchor(prefix: str, path: str) -> str:
    return "-".join(p for p in (prefix, re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")) if p)


def _model_table(model: type[BaseModel], anchors: dict[type[BaseModel], str]) -> str:
    docs = attribute_docstrings(model)
    extra = _extra_columns(model)
    head = ["key", "type", "default", *(extra[0] if extra else []), "description"]
    rows = []
    for name, field in model.model_fields.items():
        cells = [f"`{name}`", type_text(field, model, name, anchors), default_text(field)]
        if extra:
            cells += extra[1](name)
        cells.append(_description(field, docs.get(name), anchors))
        rows.append(cells)
    if not any(row[-1] for row in rows):  # no field says more than its type: no empty column
        head.pop()
        rows = [row[:-1] for row in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("\n", " ").replace("|", "&#124;")


def _description(field: FieldInfo, docstring: str | None, anchors: dict[type[BaseModel], str]) -> str:
    text = field.description or docstring
    if text:
        return _rst_to_md(text)
    # A nested model's own docstring says what the key holds.
    for sub, _ in _models_in(field.annotation):
        if "__doc__" in sub.__dict__ and sub.__doc__:
            return _rst_to_md(_first_sentence(inspect.getdoc(sub) or ""))
    return ""


def _first_sentence(text: str) -> str:
    paragraph = text.split("\n\n")[0]
    match = re.match(r"(.+?\.)(\s|$)", paragraph, re.DOTALL)
    return match.group(1) if match else paragraph


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string literal right under the field in the class body (pydantic's
    ``use_attribute_docstrings`` reads the same; the models here do not turn it on)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for stmt, following in itertools.pairwise(body):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            out[stmt.target.id] = inspect.cleandoc(following.value.value)
    return out


def _rst_to_md(text: str) -> str:
    """The docstrings' reStructuredText inline markup as Markdown (``x`` and :role:`x` to `x`)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


# Types -------------------------------------------------------------------------------------------------


def type_text(field: FieldInfo, model: type[BaseModel], name: str, anchors: dict[type[BaseModel], str]) -> str:
    """How a value of the field is written, with its bounds (``integer ≥ 1``, ``"a" or "b"``, a link to a
    nested model's table); a duration or size field parsed by a validator says so."""
    parsed = _parsed_as(model, name)
    if parsed:
        optional = _is_optional(field.annotation)
        return parsed + (" or `null`" if optional else "")
    return _annotation_text(field.annotation, list(field.metadata), anchors)


def _parsed_as(model: type[BaseModel], name: str) -> str | None:
    """``duration``/``size`` for a field whose ``before`` validator parses one (``"8h"``, ``"4GiB"``)."""
    for decorator in model.__pydantic_decorators__.field_validators.values():
        if name in decorator.info.fields and decorator.info.mode == "before":
            source = inspect.getsource(decorator.func)
            if "parse_duration(" in source:
                return "duration (`90s`, `15m`, `8h`, or seconds)"
            if "parse_size(" in source:
                return "size (`512MiB`, `4GiB`, or bytes)"
    return None


def _is_optional(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (Union, types.UnionType) and type(None) in typing.get_args(annotation)


_NAMES = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "`null`",
          Path: "path"}


def _annotation_text(annotation: Any, metadata: list[Any], anchors: dict[type[BaseModel], str]) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = list(metadata)
        for extra in args[1:]:
            inner.extend(extra.metadata if isinstance(extra, FieldInfo) else [extra])
        return _annotation_text(args[0], inner, anchors)
    if origin in (Union, types.UnionType):
        # None last: "integer ≥ 1 or `null`".
        ordered = sorted(args, key=lambda a: a is type(None))
        return " or ".join(_annotation_text(a, metadata if a is not type(None) else [], anchors)
                           for a in ordered)
    if origin is Literal:
        return " or ".join(f"`{json.dumps(a)}`" for a in args)
    if origin is list:
        item = _annotation_text(args[0], [], anchors) if args else "any"
        if " or " in item:
            item = f"({item})"
        return f"list of {item}" + _bounds(metadata, length=True)
    if origin is dict:
        key, value = (_annotation_text(a, [], anchors) for a in args) if args else ("string", "any")
        return f"map of {key} to {value}"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        keys = list(annotation.model_fields)
        shape = "{" + ", ".join(keys) + "}" if len(keys) <= 3 else "mapping"
        return f"[`{shape}`](#{anchors[annotation]})" if annotation in anchors else f"`{shape}`"
    name = _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return name + _bounds(metadata)


_SYMBOLS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}


def _bounds(metadata: list[Any], length: bool = False) -> str:
    parts = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            parts.append(_bounds(list(item.metadata), length).strip())
            continue
        for attr, symbol in _SYMBOLS.items():
            if isinstance(item, getattr(annotated_types, attr.capitalize())):
                parts.append(f"{symbol} {getattr(item, attr)}")
        if length and isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length}")
        if length and isinstance(item, annotated_types.MaxLen):
            parts.append(f"at most {item.max_length}")
    parts = [p for p in parts if p]
    return f" {', '.join(parts)}" if parts and not length else (f" ({', '.join(parts)})" if parts else "")


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "see its keys"
    return f"`{json.dumps(value, default=str)}`"


# Columns some models add --------------------------------------------------------------------------------


def _knob_columns() -> tuple[list[str], Callable[[str], list[str]]]:
    """Knobs: which engine kinds take each, and the flag or environment variable that carries it."""
    from runners.engines import get_engine
    from spaces.schema import ENGINE_KNOBS

    engines = {name: get_engine(name) for name in ("sglang", "vllm")}

    def cells(knob: str) -> list[str]:
        kinds = [kind for kind, knobs in ENGINE_KNOBS.items() if knob in knobs]
        carriers = []
        for engine in engines.values():
            if knob in engine.knob_flags:
                carriers.append(f"`{engine.knob_flags[knob]}`")
            elif knob in engine.env_knobs:
                carriers.append(f"environment `{engine.env_knobs[knob]}`")
        if knob == "nccl":
            carriers.append("environment, each variable as named")
        return [", ".join(f"`{k}`" for k in kinds), ", ".join(carriers)]

    return ["engine kinds", "carried by"], cells


def _metric_columns() -> tuple[list[str], Callable[[str], list[str]]]:
    """A pareto metric's allowed names, each with the direction that makes it better."""
    from spaces.schema import PARETO_METRICS

    def cells(key: str) -> list[str]:
        if key != "name":
            return [""]
        return [", ".join(f"`{name}` ({sense})" for name, sense in PARETO_METRICS.items())]

    return ["allowed"], cells


def _extra_columns(model: type[BaseModel]) -> tuple[list[str], Callable[[str], list[str]]] | None:
    maker = _EXTRA_COLUMNS.get(model.__name__)
    if maker is not None:
        return maker()
    prefix = model.model_config.get("env_prefix")
    if isinstance(prefix, str) and prefix:  # pydantic-settings: each field is also an environment variable
        return ["environment"], lambda name: [f"`{prefix}{name.upper()}`"]
    return None


_EXTRA_COLUMNS: dict[str, Callable[[], tuple[list[str], Callable[[str], list[str]]]]] = {
    "Knobs": _knob_columns, "ParetoMetric": _metric_columns}
"""Extra columns by model name, made when a table needs them (the knob columns import the engines)."""


# ---- the CLI -------------------------------------------------------------------------------------------


def cli_markdown(target: str) -> str:
    """Every command of the Typer app ``MODULE:APP``, as Typer's own docs command renders it."""
    import typer
    import typer.main
    from typer.cli import get_docs_for_click

    app = _load(target)
    if not isinstance(app, typer.Typer):
        raise PluginError(f"reference hook: {target} is not a Typer app")
    command = typer.main.get_command(app)
    name = app.info.name or "cli"
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name=name, indent=1)
    return text.strip() + "\n"


# ---- shipped space files ------------------------------------------------------------------------------


def space_markdown(relative: str) -> str:
    """A shipped space file as a YAML block, refused unless it loads as ``servetune validate`` loads it."""
    from runners.errors import ServetuneError
    from spaces.schema import load_space

    path = ROOT / relative
    try:
        load_space(path)
    except ServetuneError as exc:
        raise PluginError(f"reference hook: {relative} does not load: {exc}") from None
    return f'```yaml title="{relative}"\n{path.read_text().rstrip()}\n```\n'


# ---- servetune diagnose ---------------------------------------------------------------------------------


def diagnose_markdown(arg: str) -> str:
    """``LOG@SHOWN``: the console block of ``servetune diagnose SHOWN`` run on the repository's file LOG."""
    from runners.diagnose import diagnose_file, render_text
    from runners.errors import ServetuneError

    relative, _, shown = arg.partition("@")
    shown = shown or relative
    try:
        text = render_text(diagnose_file(ROOT / relative), source=shown)
    except ServetuneError as exc:
        raise PluginError(f"reference hook: diagnose {relative}: {exc}") from None
    return f"```console\n$ servetune diagnose {shown}\n{text.rstrip()}\n```\n"
