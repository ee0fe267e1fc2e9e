"""``servetune``: a thin CLI over the library. Each command parses, validates, calls one function.

An expected error (bad space file, unknown study, unreachable storage or host) is one line on stderr and
a non-zero exit, never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.text import Text

from runners.errors import ConfigError, HostBusy, HostMisconfigured, ServetuneError, first_line
from search.cli.safe import SafeConsole, SafeLogHandler, safe_write
from search.files import write_file
from search.spaces import load_checked_space as load_space
from spaces.schema import parse_duration

app = typer.Typer(
    name="servetune",
    help="Find the fastest SGLang/vLLM launch settings that do not run out of memory.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: "[default: the best]" is a literal, never a markup tag that disappears.
    rich_markup_mode=None,
)
hosts_app = typer.Typer(help="Check GPU hosts.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(hosts_app, name="hosts")

console: Console = SafeConsole()
err_console: Console = SafeConsole(stderr=True)

StudyOpt = Annotated[str, typer.Option("--study", "-s", help="Study name.")]
StorageOpt = Annotated[str | None, typer.Option("--storage", help="SQLAlchemy URL of the Optuna storage.")]
MlflowOpt = Annotated[str | None, typer.Option("--mlflow-uri", help="MLflow tracking URI.")]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("servetune")
        except PackageNotFoundError:
            number = "unknown (not installed)"
        safe_write(f"servetune {number}\n")
        raise typer.Exit()


@app.callback()
def _main(
    version_flag: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False,
) -> None:
    """Find the fastest SGLang/vLLM launch settings that do not run out of memory."""


def _settings(**cli: Any) -> Any:
    from search.settings import load_settings

    return load_settings(**cli)


def _open(study: str, storage: str | None = None, *, settings: Any = None) -> Any:
    """Load an existing study (StudyError when the storage or the study is missing); ``settings``: already
    loaded ones (then ``storage`` is not looked at)."""
    from search.settings import study_name
    from search.storage import open_study

    study_name(study)
    if settings is None:
        settings = _settings(storage=storage)
    return open_study(settings.storage, study)


@app.command()
def run(
    space_file: Annotated[Path, typer.Argument(help="Space file (YAML).", show_default=False)],
    study: Annotated[str | None, typer.Option("--study", "-s", help="Study name [default: the space's name].")] = None,
    storage: StorageOpt = None,
    n_trials: Annotated[int | None, typer.Option("--n-trials", "-n", min=1,
                                                 help="Search launches the study should hold (reuses count, skips and "
                                                      "confirmations do not).")] = None,
    timeout: Annotated[str | None, typer.Option("--timeout", help="Wall-clock budget, e.g. 8h, 90m.")] = None,
    host: Annotated[list[str] | None, typer.Option("--host", help="user@name[:port]; repeatable.")] = None,
    inventory: Annotated[Path | None, typer.Option("--inventory", help="Hosts inventory YAML.")] = None,
    accept_new_host_key: Annotated[bool, typer.Option(help="Add unknown host keys to known_hosts.")] = False,
    mlflow_uri: MlflowOpt = None,
    no_mlflow: Annotated[bool, typer.Option("--no-mlflow", help="Do not log to MLflow.")] = False,
    artifacts_dir: Annotated[Path | None, typer.Option(help="Where trial artifacts are kept.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    host_cooldown: Annotated[str, typer.Option(
        "--host-cooldown", help="How long a host that keeps failing is set aside, e.g. 5m.")] = "5m",
    storage_retry: Annotated[str | None, typer.Option(
        "--storage-retry", help="How long a dropped connection to the study's database server is retried "
                                "while the running trials go on, e.g. 5m [default: 5m].")] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Live display.")] = True,
    confirm_top: Annotated[int, typer.Option(
        "--confirm-top", min=0, help="Best distinct configurations launched again before the end.")] = 3,
    confirm_repeats: Annotated[int, typer.Option(
        "--confirm-repeats", min=0, help="More launches of each of them.")] = 1,
    confirm_final: Annotated[int, typer.Option(
        "--confirm-final", min=0, help="More launches of the one chosen on them: its reported figure.")
    ] = 3,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the hosts and the first launches with their commands; launch nothing, "
                          "write nothing.")] = False,
    warm_start: Annotated[list[str] | None, typer.Option(
        "--warm-start", help="Start from an earlier study in the same storage (its memory figures and best "
                             "configurations), if it ran on the same cards, model, engine version and fixed args; "
                             "repeatable; 'auto': every such study.")] = None,
    early_stop: Annotated[bool, typer.Option(
        "--early-stop/--no-early-stop", help="Stop a launch's benchmark after the target level's first quarter "
                                             "of requests when they show it cannot beat the best.")] = True,
) -> None:
    """Run (or resume) a search: launch, benchmark and record one trial after another.

    The same command again resumes the study; on several machines (servetune worker, a PostgreSQL
    --storage) each controller runs its own hosts and the budget is shared. First Ctrl-C/SIGTERM:
    finish the running trials and stop; second: abort them.
    """
    from search.api import run_study
    from search.cli.views import Progress, print_plan, print_run
    from search.driver.run import StopReason

    space = load_space(space_file)
    settings = _settings(storage=storage, mlflow_uri=mlflow_uri, artifacts_dir=artifacts_dir,
                         storage_retry=_duration("--storage-retry", storage_retry) if storage_retry else None)
    if dry_run:
        _dry_run(space, settings, study=study, n_trials=n_trials, timeout=timeout, hosts=host or [],
                 inventory=inventory)
        return

    def on_start(plan: Any) -> None:
        _print_held(space)
        print_plan(console, plan, simulated=space.engine.simulated)

    summary = run_study(
        space, settings, study_name=study, n_trials=n_trials,
        timeout=_duration("--timeout", timeout) if timeout else None, hosts=host or [], inventory=inventory,
        accept_new_host_key=accept_new_host_key, mlflow=not no_mlflow, seed=seed,
        cooldown=_duration("--host-cooldown", host_cooldown),
        progress=Progress(console, n_trials=None, metric=space.objective.scored_by, live=live,
                          simulated=space.engine.simulated),
        on_start=on_start, confirm_k=confirm_top, confirm_repeats=confirm_repeats, confirm_final=confirm_final,
        warm_start=warm_start or (), early_stop=early_stop,
    )
    print_run(console, err_console, summary, space)
    name = summary.study.study_name
    if summary.stopped_by is StopReason.ARTIFACTS:
        _line(f"servetune: error: stopped before the next trial: {summary.stopped_by}: {summary.artifacts_error} "
              f"(every result is in the study: servetune report --study {name})")
        raise typer.Exit(1)
    if summary.report_error is not None:
        _line(f"servetune: {summary.report_error} (the study is stored: servetune report --study {name})")
    if summary.stopped_by.interrupted:
        raise typer.Exit(130)
    if summary.no_progress is not None:
        _line(f"servetune: error: {summary.no_progress}")
        raise typer.Exit(1)


app.command(name="worker", help="Join a (shared) study as one more controller; same options as run.")(run)


def _dry_run(space: Any, settings: Any, *, study: str | None, n_trials: int | None, timeout: str | None,
             hosts: list[str], inventory: Path | None) -> None:
    """``run --dry-run``: what the run would launch, from the space and (read only) the study's trial count."""
    from search.cli.describe import dry_run
    from search.cli.views import print_dry_run
    from search.driver.hosts import host_names
    from search.settings import study_name

    name = study_name(space.name if study is None else study)
    plan = dry_run(space, study=name, hosts=host_names(hosts, inventory),
                   n_trials=n_trials if n_trials is not None else space.budget.n_trials,
                   timeout=_duration("--timeout", timeout) if timeout else space.budget.timeout,
                   existing_trials=_trial_count(settings.storage, name))
    print_dry_run(console, plan, simulated=space.engine.simulated)


def _trial_count(storage: str, name: str) -> int:
    """Trials study ``name`` holds already; 0 when it or its storage does not exist (nothing is created)."""
    from search.storage import open_storage

    try:
        rdb = open_storage(storage, heartbeat=False, must_exist=True)
    except ServetuneError:
        return 0
    try:
        study_id = rdb.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(rdb.get_all_trials(study_id, deepcopy=False))


@app.command()
def validate(space_file: Annotated[Path, typer.Argument(help="Space file (YAML).")]) -> None:
    """Check a space file and say in words what would be searched: each knob and its values, the grid, the
    workload, objective and budget, and the command of the first launch."""
    from search.cli.describe import check_complete, describe_space

    space = load_space(space_file)
    check_complete(space, space_file)
    console.print(f"{space_file}: ok", markup=False, highlight=False)
    for line in describe_space(space):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    _print_inert(space)
    for line in space.warnings():
        console.print(f"  warning: {line}", markup=False, soft_wrap=True)


def _print_held(space: Any) -> None:
    """One line per knob the engine version ignores: held at the engine default, not searched."""
    from search.strategy.distributions import held_inert

    for knob, why in held_inert(space).items():
        console.print(f"  {knob}: not searched, held at the engine default ({why}; "
                      f"search_inert: [{knob}] in the space searches it anyway)", markup=False, soft_wrap=True)


def _print_inert(space: Any) -> None:
    """One line per searched knob the engine version ignores: held at the engine default (not searched),
    or searched anyway where the space's ``search_inert`` names it."""
    from search.strategy.distributions import held_inert, inert_knobs
    from spaces.launch import engine_options

    inert = inert_knobs(space.engine.kind, space.engine.version, engine_options(space))
    held = held_inert(space)
    for knob in sorted(set(inert) & set(space.knobs.searched())):
        then = (f"not searched, held at the engine default (search_inert: [{knob}] in the space searches it "
                "anyway)" if knob in held else "searched anyway (search_inert)")
        console.print(f"  warning: {knob} has no effect: {inert[knob]}; {then}", markup=False, soft_wrap=True)


@app.command()
def trials(
    study: StudyOpt,
    storage: StorageOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List a study's trials: state, outcome, role (probe, design, search, screening, final, skipped; the chosen
    one marked), key telemetry, objective."""
    from search.cli.views import summary_table
    from search.outputs.explain import trial_rows
    from search.strategy.view import StudyView

    view = StudyView.of(_open(study, storage))
    if as_json:
        safe_write(json.dumps(trial_rows(view), indent=2, default=str) + "\n")
    else:
        chosen = view.choice.number if view.choice is not None else None
        console.print(summary_table(view.records, "objective", width=console.width, chosen=chosen))


@app.command()
def export(
    study: StudyOpt,
    trial: Annotated[int | None, typer.Option("--trial", help="Trial number [default: the best].")] = None,
    min_free_gib: Annotated[float | None, typer.Option("--min-free-gib", min=0,
                                                       help="Only trials with this much free GPU memory after "
                                                            "graph capture.")] = None,
    pick: Annotated[str | None, typer.Option(
        "--pick", help="pareto studies: how to pick from the front, 'knee' or conditions such as "
                       "'p99_tpot_ms<=200' (then the best on the first metric) [default: knee].")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here [default: stdout].")] = None,
    storage: StorageOpt = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", help="Render for this real engine (sglang) to serve on a GPU box, e.g. a study tuned on the "
                         "simulated host [default: repeat the tuning launch].")] = None,
    space_file: Annotated[Path | None, typer.Option(
        "--space", help="Space file whose deploy section to use with --engine [default: the one the study's "
                        "run stored].")] = None,
    python: Annotated[str | None, typer.Option("--python", help="With --engine: the engine's python on the GPU "
                                                                 "box [default: deploy.python].")] = None,
    bind: Annotated[str | None, typer.Option("--bind", help="With --engine: the address to serve on "
                                                             "[default: deploy.host, else 0.0.0.0].")] = None,
) -> None:
    """Write the launch script of the best (or a given, or for a pareto study a picked) trial."""
    from search.outputs.export import export_script, overridden, stored_deploy, write_script
    from search.strategy.view import StudyView

    st = _open(study, storage)
    deploy = None
    if engine is not None:
        deploy = overridden(load_space(space_file).deploy if space_file is not None else stored_deploy(st),
                            python=python, bind=bind)
    elif space_file is not None or python is not None or bind is not None:
        raise ConfigError("--space, --python and --bind go with --engine (they render a script for a GPU box)")
    script = export_script(StudyView.of(st), trial=trial, min_free_gib=min_free_gib, pick=pick, engine=engine,
                           deploy=deploy)
    if output is None:
        safe_write(script)
        return
    write_script(output, script)
    err_console.print(f"wrote {output}")


@app.command(name="sync-mlflow")
def sync_mlflow(study: StudyOpt, storage: StorageOpt = None, mlflow_uri: MlflowOpt = None) -> None:
    """Back-fill MLflow with every finished trial it is missing (idempotent)."""
    from search.outputs.tracking import MlflowTracker

    settings = _settings(storage=storage, mlflow_uri=mlflow_uri)
    st = _open(study, settings=settings)
    from search.storage import artifact_store
    from search.strategy.view import StudyView

    # The study is read in full before MLflow is touched: a broken storage is one line, and no MLflow
    # database is made (with MLflow's own set-up lines on stderr) for a sync that cannot happen.
    view = StudyView.of(st)
    store = artifact_store(settings.artifacts_dir)
    tracker = MlflowTracker(settings.mlflow_uri, optuna_artifact_store=store)
    result = tracker.sync(st)
    tracker.finish_study(view)  # the parent run too: an outage may have left it RUNNING
    console.print(f"mlflow: {result.added} run(s) added, {result.present} already present")


@app.command()
def report(
    study: StudyOpt,
    storage: StorageOpt = None,
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", help="Where to write it ('-': standard output) [default: Markdown to standard output; "
                               "HTML to STUDY-report.html here].")] = None,
    fmt: Annotated[str, typer.Option("--format", help="md (Markdown) or html (one self-contained file, "
                                                      "with the figures).")] = "md",
) -> None:
    """The morning summary: verdict, OOM boundary, failures, every trial (Markdown or HTML)."""
    from search.outputs.html import report_html
    from search.outputs.report import report_markdown
    from search.strategy.view import StudyView

    if fmt not in ("md", "html"):
        raise ConfigError(f"--format: {fmt!r} is not one of md, html")
    view = StudyView.of(_open(study, storage))
    text = report_html(view) if fmt == "html" else report_markdown(view)
    if output is None and fmt == "html":
        # Megabytes of inlined plotly.js are no terminal's business: a file, and its path.
        output = Path(f"{view.name}-report.html")
    if output is None or str(output) == "-":
        safe_write(text)
        return
    write_file(output, text)
    err_console.print(f"wrote {output}")
    if fmt == "html":
        sys.stdout.write(f"{output.resolve()}\n")


@app.command()
def status(
    study: StudyOpt,
    storage: StorageOpt = None,
    n_trials: Annotated[int | None, typer.Option(
        "--n-trials", help="The budget, for the time-left estimate [default: the latest run's].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")] = False,
) -> None:
    """Where a study stands (works while the search runs elsewhere)."""
    from search.outputs.status import study_status
    from search.strategy.view import StudyView

    view = StudyView.of(_open(study, storage))
    data = study_status(view, n_trials=n_trials if n_trials is not None else view.n_trials)
    if as_json:
        safe_write(json.dumps(data.model_dump(), indent=2, default=str) + "\n")
        return
    from search.cli.views import status_view

    console.print(status_view(data))


@app.command()
def dashboard(
    storage: StorageOpt = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port.")] = None,
    artifacts_dir: Annotated[Path | None, typer.Option(help="Trial artifacts directory.")] = None,
) -> None:
    """Start optuna-dashboard on the study storage and its artifact store."""
    import optuna_dashboard

    from search._optuna_compat import study_id_of
    from search.storage import artifact_store, open_storage

    settings = _settings(storage=storage, artifacts_dir=artifacts_dir, dashboard_port=port)
    store = artifact_store(settings.artifacts_dir)
    rdb = open_storage(settings.storage, heartbeat=False, must_exist=True)
    url = f"http://{host}:{settings.dashboard_port}"
    console.print(f"optuna-dashboard on {url} (Ctrl-C to stop)")
    for summary in rdb.get_all_studies():
        # optuna-dashboard shows a study's note on its own page: servetune's choice and why are there.
        console.print(f"  study {summary.study_name}: servetune's choice and why at "
                      f"{url}/dashboard/studies/{study_id_of(summary)}/note", soft_wrap=True)
    try:
        optuna_dashboard.run_server(rdb, host=host, port=settings.dashboard_port, artifact_store=store)
    except OSError as exc:
        raise ConfigError(f"cannot serve on {host}:{settings.dashboard_port}: {exc.strerror or exc}") from None


@app.command()
def diagnose(
    log: Annotated[Path, typer.Argument(help="Server log file (SGLang or vLLM), as written or as pasted.",
                                        show_default=False)],
    engine: Annotated[str | None, typer.Option(
        "--engine", help="sglang or vllm, when the log does not say (default: from the log, else sglang).")] = None,
    version: Annotated[str | None, typer.Option(
        "--version", help="Engine version, when the log does not say.")] = None,
    exit_code: Annotated[int | None, typer.Option(
        "--exit-code", help="How the server ended, when known (e.g. 137).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (its keys: docs, Reading the results).")] = False,
) -> None:
    """Read a server log and print the verdict a trial would record: outcome, phase, reason, memory, bound."""
    from runners.diagnose import diagnose_file, render_text

    result = diagnose_file(log, engine=engine, version=version, exit_code=exit_code)
    if as_json:
        safe_write(result.to_json() + "\n")
    else:
        safe_write(render_text(result, source=str(log)))


@hosts_app.command("check")
def hosts_check(
    space_file: Annotated[Path, typer.Option("--space", help="Space file (engine and python to check).")],
    host: Annotated[list[str] | None, typer.Option("--host", help="user@name[:port]; repeatable.")] = None,
    inventory: Annotated[Path | None, typer.Option("--inventory")] = None,
    accept_new_host_key: Annotated[bool, typer.Option()] = False,
) -> None:
    """Preflight each host and print a table: reachable, engine and version, GPUs, free memory, busy."""
    from rich.table import Table

    from search.driver.hosts import build_hosts
    from search.trial.preflight import preflight

    space = load_space(space_file)
    settings = _settings()
    hosts = build_hosts(space, host_args=host or [], inventory=inventory, runs_root=settings.runs_root,
                        sim_dir=settings.sim_dir, accept_new_host_key=accept_new_host_key,
                        host_dir=settings.host_dir)
    table = Table(title="servetune hosts", box=box.SIMPLE_HEAD)
    # Short cells never break; what can be long (who holds a host, an error) wraps at its spaces.
    for col in ("host", "reachable", "engine", "GPUs", "free MiB", "busy", "held by"):
        table.add_column(col, no_wrap=col in ("host", "reachable"))
    table.add_column("error", ratio=1)
    bad = 0
    sim = " (simulated)" if space.engine.simulated else ""
    for h in hosts:
        try:
            info = preflight(h, space)
            gpus = f"{len(info.gpus)}x {info.gpu_name}{sim}"
            table.add_row(h.name, "yes", f"{info.engine} {info.engine_version}", gpus, f"{info.free_mib:.0f}{sim}",
                          f"yes: {info.reason}" if info.busy else "no", _held_by(h), "-")
            bad += int(info.busy)
        except ServetuneError as exc:
            reachable = "yes" if isinstance(exc, HostBusy | HostMisconfigured) else "no"
            table.add_row(h.name, reachable, "-", "-", "-", "-", "-", Text(first_line(exc), style="red"))
            bad += 1
        finally:
            h.close()
    console.print(table)
    if bad:
        raise typer.Exit(1)


def _line(text: str) -> None:
    """One plain line on stderr (no markup, no wrapping: paths and errors may hold ``[`` or be long)."""
    safe_write(" ".join(text.split()) + "\n", sys.stderr)


def _held_by(host: Any) -> str:
    """Who holds ``host`` now (its claim), and which other controllers have a live lease on it."""
    hold = host.hold
    if hold is None:  # a scheduler decides who gets the GPUs: no lease, no claim
        return "nobody"
    holder = hold.holder()
    others = [lease for lease in hold.live() if holder is None or lease.controller != holder.controller]
    parts = [f"running a trial: {holder.describe()}"] if holder is not None else []
    parts += [f"lease: {lease.describe()}" for lease in others]
    return "; ".join(parts) or "nobody"


def _duration(flag: str, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def main() -> None:
    import optuna
    from optuna.exceptions import StorageInternalError
    from sqlalchemy.exc import SQLAlchemyError

    from search.storage import storage_error_line

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger().addHandler(SafeLogHandler())  # instead of the last-resort handler: escaped lines
    try:
        app()
    except (StorageInternalError, SQLAlchemyError) as exc:
        # The study storage broke after it was opened (a SQLite file with garbage in the middle, a database
        # gone): every command says so in one line.
        safe_write(f"servetune: error: the study storage failed: {' '.join(storage_error_line(exc).split())}; "
                   "fix: restore the storage from a backup or point --storage at a good one\n", sys.stderr)
        sys.exit(1)
    except ServetuneError as exc:
        safe_write(f"servetune: error: {' '.join(str(exc).split())}\n", sys.stderr)
        sys.exit(1)
