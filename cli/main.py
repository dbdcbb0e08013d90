"""``tessera``: serve, submit, runs, show, cancel, train.

The client commands talk to the service at ``--url`` (env ``TESSERA_URL``, default the URL in
the nearest ``.tessera/credentials``, else http://127.0.0.1:8000). ``serve`` and ``train``
import the service / the workers lazily, so the client commands work where only the SDK is
installed.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table

from cli.data import app as data_app
from cli.export import register as register_export
from cli.housekeeping import register as register_housekeeping
from cli.lineage import register as register_lineage
from cli.logs import register as register_logs
from cli.output import (EPILOG, EXIT_INTERRUPTED, EXIT_USAGE, ID_WIDTH, STATUS_WIDTH, JsonOption, LimitOption,
                        SetOption, UrlOption, call, console, emit, err_console, fail, first_items, following, kept,
                        listing, needs_extra, none_listed, status_value)
from cli.run_info import durations_line, register as register_run_info

if TYPE_CHECKING:
    from api.client import Client

# Exit codes, --json and the environment are one convention for every command: cli/output.py.
app = typer.Typer(no_args_is_help=True, help="Tessera: fast PyTorch training runs as a service.", epilog=EPILOG)
app.add_typer(data_app, name="data")



_fail = fail  # the names the commands (and cli/access.py) use
_call = call


def _client(url: str | None) -> Client:
    from api.client import Client

    return Client(url)


register_logs(app, UrlOption, _call)
register_export(app, UrlOption)
register_housekeeping(app, UrlOption, _call)
register_lineage(app, UrlOption, _call, console)
register_run_info(app, UrlOption, _call)


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="bind address (env TESSERA_HOST)")] = None,
    port: Annotated[Optional[int], typer.Option(help="port (env TESSERA_PORT)")] = None,
    workers: Annotated[Optional[int], typer.Option(
        help="API processes (env TESSERA_WORKERS; above 1 needs PostgreSQL); one of them dispatches")] = None,
) -> None:
    """Run the control plane (API, dispatcher, dashboard) with settings from TESSERA_* env vars.

    With none set, it keeps its database, storage, logs and credentials under TESSERA_HOME (default: ./.tessera).

    README "Configuration" lists every variable (TESSERA_DATABASE_URL, TESSERA_STORAGE_URL, ...)."""
    try:
        from service.main import run
    except ModuleNotFoundError as exc:
        needs_extra("service", exc)

    run(host=host, port=port, workers=workers)


@app.command()
def submit(
    file: Annotated[str, typer.Argument(help="RunSpec as YAML or JSON")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show live progress until the run ends")] = False,
    code: Annotated[Optional[str], typer.Option(
        "--code", help="a folder with the code that model.import, data.*.import and eval_metrics imports name: "
        "packed (respecting its .gitignore), uploaded once, recorded as the spec's code.digest")] = None,
    project: Annotated[Optional[str], typer.Option(help="the project (default: the key's only one, "
                                                        "else 'default')")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option(
        "--idempotency-key", help="submitting again with the same key (in the project) returns the first run "
        "instead of making a second; default: a fresh key, reused on this command's own retries")] = None,
    assignments: SetOption = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a run; with --follow, watch it until it ends (exit 1 unless COMPLETED).

    With --json, stdout is the RunView as JSON (the final one with --follow; progress on stderr)."""
    if code is not None:
        _require_folder(code)  # a usage error first
    body = _spec_file(file, assignments)
    client = _client(url)
    out = err_console if as_json else console  # with --json, stdout carries only the JSON
    if code is None:
        _warn_of_unshipped_code(body, spec_file=file)
    else:
        from api.code_package import with_code_digest

        body = with_code_digest(body, _upload_code(client, code, project=project, out=out))
    run = _call(client.create_run, body, project=project, idempotency_key=idempotency_key)
    if run.replayed:
        out.print(f"run [bold]{run.id}[/bold] ({run.name}) was submitted earlier with this --idempotency-key: "
                  f"nothing new queued; status {run.status.value}", soft_wrap=True)
    elif run.replayed is None and idempotency_key is not None:  # a retry answered as a replay
        out.print(f"run [bold]{run.id}[/bold] ({run.name}) status {run.status.value}: submitted by this command or "
                  "an earlier one with this --idempotency-key (an answer was lost and retried)", soft_wrap=True)
    else:
        out.print(f"submitted run [bold]{run.id}[/bold] ({run.name}) status {run.status.value}", soft_wrap=True)
    _emit_or_follow(client, run, follow=follow, as_json=as_json, out=out)


def _emit_or_follow(client: "Client", run, *, follow: bool, as_json: bool, out) -> None:
    """Print ``run`` (JSON with ``as_json``), or with ``follow`` watch it to its end on ``out``,
    then print the final view; exit 1 unless it COMPLETED."""
    if not follow:
        emit(run, as_json=as_json, render=lambda: None)
        return
    from cli.follow import follow_run

    with following(f"run {run.id}", f"tessera cancel {run.id}"):  # Ctrl-C: the run goes on, and the user hears it
        final = _call(follow_run, client, run.id, console=out)
    emit(final, as_json=as_json, render=lambda: _print_summary(final))
    if final.status.value != "COMPLETED":
        raise typer.Exit(1)


def _warn_of_unshipped_code(spec: Any, *, prefix: str = "", spec_file: str | None = None) -> None:
    """Without ``--code``, say on stderr when the spec imports a module that lies in this folder,
    or in the folder of ``spec_file``: the workers look for it installed and would fail a minute
    later, after queueing and Ray's start (it may be installed there, so this is a warning, not a
    refusal). ``prefix``: where the run spec sits in the file (``base.`` for a sweep)."""
    if not isinstance(spec, dict) or (isinstance(spec.get("code"), dict) and spec["code"].get("digest")):
        return
    data = spec.get("data") if isinstance(spec.get("data"), dict) else {}
    metrics = spec.get("eval_metrics") if isinstance(spec.get("eval_metrics"), list) else []
    sources = [("model.import", spec.get("model")), *((f"data.{part}.import", data.get(part)) for part in data),
               *((f"eval_metrics[{index}].import", metric) for index, metric in enumerate(metrics))]
    folders = [Path(".")]
    if spec_file is not None and spec_file != "-" and Path(spec_file).parent.resolve() != Path(".").resolve():
        folders.append(Path(spec_file).parent)
    for field, source in sources:
        path = source.get("import") if isinstance(source, dict) else None
        if not isinstance(path, str):
            continue
        top = path.partition(":")[0].split(".")[0]
        for folder in folders:
            if top and ((folder / top).is_dir() or (folder / f"{top}.py").is_file()):
                where = "this folder" if folder == Path(".") else f"{folder}, the spec's folder"
                # A package (with __init__.py) is packed as itself; a module or a namespace folder
                # is importable from the folder that holds it, which --code packs as a root.
                send = folder / top if (folder / top / "__init__.py").is_file() else folder
                how = (f"--code {send} sends it with the run" if send != Path(".") else
                       f"--code DIR sends it with the run, DIR a folder that holds {top} and little else")
                err_console.print(f"warning: {prefix}{field} {path!r} names {top!r}, which is in {where}, but no "
                                  f"--code was given: the workers will import it only if it is installed there "
                                  f"({how})", highlight=False, markup=False, soft_wrap=True)
                return


def _upload_code(client: Client, folder: str, *, project: str | None = None, out=console) -> str:
    """Pack and upload ``folder`` to ``project`` (unless it has it); returns its digest."""
    from api.code_package import CodePackageError, pack_directory

    try:
        package = pack_directory(folder)
    except CodePackageError as exc:
        _fail(str(exc))
    stored = _call(client.has_code, package.digest, project=project)
    if not stored:
        _call(client.upload_code, package, project=project)
    what = "already on the service" if stored else "uploaded"
    out.print(f"code package {package.digest[:12]} ({len(package.files)} files, {len(package.data) / 1024:.1f} "
              f"KiB) {what}", highlight=False)
    return package.digest


def _time_value(value: str | None):
    """A ``--created-after``/``--created-before`` value: an ISO 8601 date or time as a datetime
    (no offset: UTC, as the service reads it), else a usage error that names the value."""
    if value is None:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.strip())
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 date or time; e.g. 2026-05-01, 2026-05-01T14:30 or "
                                 "2026-05-01T14:30+02:00 (no offset: UTC)") from None


@app.command()
def runs(
    action: Annotated[Optional[str], typer.Argument(metavar="[list]", help="`list` (the default)")] = None,
    status: Annotated[Optional[str], typer.Option(help="only runs with this status (any case), e.g. completed",
                                                  callback=lambda value: status_value(value, "RunStatus"))] = None,
    tag: Annotated[Optional[str], typer.Option(help="only runs with this tag")] = None,
    name: Annotated[Optional[str], typer.Option(help="only runs whose name contains this")] = None,
    project: Annotated[Optional[str], typer.Option(help="only this project's runs (default: every project of "
                                                        "your key)")] = None,
    sweep: Annotated[Optional[str], typer.Option(help="only this sweep's trials (a sweep id)")] = None,
    created_after: Annotated[Optional[str], typer.Option(
        help="only runs created after this time: ISO 8601, e.g. 2026-05-01 or 2026-05-01T14:30 (no offset: UTC, as "
             "the created column)", callback=_time_value)] = None,
    created_before: Annotated[Optional[str], typer.Option(
        help="only runs created before this time (ISO 8601, as --created-after)", callback=_time_value)] = None,
    order_by: Annotated[Optional[str], typer.Option(
        help="best:<metric key>, e.g. best:eval/accuracy: that key's best value first; only runs that reported "
             "the key")] = None,
    archived: Annotated[str, typer.Option(help="false (hide archived runs), true (only them) or all")] = "false",
    limit: LimitOption = "20",
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List runs (also: tessera runs list), newest first or by a metric's best value (--json: a list of RunViews)."""
    if action not in (None, "list"):
        _fail(f"unknown action {action!r}: `tessera runs` or `tessera runs list`", EXIT_USAGE)
    listed = _call(first_items, _client(url).list_runs, limit, status=status, tag=tag, name=name, sweep_id=sweep,
                   created_after=created_after, created_before=created_before, order_by=order_by, archived=archived,
                   project=project)
    best_key = order_by.removeprefix("best:") if order_by else None
    several_projects = len({run.project for run in listed}) > 1  # an admin's listing: say whose each is
    columns = [kept("id", ID_WIDTH), "name", *(["project"] if several_projects else []), kept("status", STATUS_WIDTH),
               "attempt", "created", "tags", kept("latest eval/accuracy", METRIC_WIDTH, wrap_header=True),
               kept("latest train/loss", METRIC_WIDTH, wrap_header=True)]
    table = listing(*columns, *([kept(f"best {best_key}", METRIC_WIDTH, wrap_header=True)] if best_key else []))
    for run in listed:
        best = [_metric(run.best, best_key)] if best_key else []
        table.add_row(run.id, run.name, *([run.project] if several_projects else []), _status(run), str(run.attempt),
                      run.created_at.strftime("%Y-%m-%d %H:%M:%S"), " ".join(run.tags),
                      _metric(run.summary, "eval/accuracy"), _metric(run.summary, "train/loss"), *best)

    def render() -> None:
        console.print(table)
        if listed:
            return
        notes = [f"only runs that reported {best_key} are listed (a mistyped key lists none; tessera metrics RUN "
                 "shows a run's keys)"] if best_key else []
        times = {"created-after": created_after, "created-before": created_before}
        none_listed("runs", {"status": status, "tag": tag, "name": name, "project": project, "sweep": sweep,
                             **{option: when.isoformat() for option, when in times.items() if when is not None},
                             "order-by": order_by}, *notes, archived=archived)

    emit(listed, as_json=as_json, render=render)


@app.command()
def show(run_id: str, url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Show one run: status, times, summary, error and its status events (--json: the RunView)."""
    client = _client(url)
    run = _call(client.get_run, run_id)
    if as_json:
        emit(run, as_json=True, render=lambda: None)
        return
    from api.views import RunStatus

    events = _call(client.run_events, run_id)
    # started_at is the run's first start; a later attempt's (resume, continue) follows once it is RUNNING: when it
    # began training, or when its RUNNING event was stored (a service older than attempt_started_at)
    this_attempt = [e.time for e in events.data if e.to_status is RunStatus.RUNNING and e.attempt == run.attempt]
    attempt_started = (f" (attempt {run.attempt} started {run.attempt_started_at or this_attempt[0]})"
                       if run.attempt > 1 and this_attempt else "")
    console.print(f"[bold]{run.id}[/bold] {run.name}  status {run.status.value}  attempt {run.attempt}")
    console.print(f"created {run.created_at}  started {run.started_at}{attempt_started}  finished {run.finished_at}",
                  soft_wrap=True)
    durations = durations_line(run)
    if durations is not None:
        console.print(durations, highlight=False)
    console.print(f"project {run.project}", highlight=False)
    if run.parent_id is not None:
        origin = f"its checkpoint at batch {run.fork.step}" if run.fork and run.fork.step is not None else "scratch"
        console.print(f"forked from {run.parent_id} ({origin})", highlight=False)
    if run.queue is not None:
        console.print(f"queue: position {run.queue.position}, waiting for {run.queue.reason}"
                      + (f" ({run.queue.detail})" if run.queue.detail else ""), highlight=False)
    _print_summary(run)
    table = Table("time", "from", "to", "attempt", "message")
    for event in events.data:
        table.add_row(str(event.time), event.from_status.value if event.from_status else "-", event.to_status.value,
                      str(event.attempt), event.message or "")
    console.print(table)


@app.command()
def cancel(run_id: str, url: UrlOption = None) -> None:
    """Cancel a run (its Ray job is stopped)."""
    run = _call(_client(url).cancel_run, run_id)
    console.print(f"run {run.id} is {run.status.value}")


@app.command()
def resume(
    run_id: str,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="resume on this many workers (the checkpoint reshards); default: as before")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show live progress until the run ends")] = False,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Resume a FAILED, CANCELED or STOPPED run as a new attempt from its newest committed checkpoint.

    With --json, stdout is the RunView as JSON (the final one with --follow; progress on stderr)."""
    client = _client(url)
    out = err_console if as_json else console  # with --json, stdout carries only the JSON
    from api.views import RunStatus

    run = _call(client.resume_run, run_id, num_workers=workers)
    try:  # what the resume's event says (e.g. that it starts over); the resume is done either way
        events = client.run_events(run.id).data
    except Exception:
        events = []
    resumed = [e for e in events if e.to_status is RunStatus.QUEUED and e.attempt == run.attempt]
    said = f": {resumed[-1].message}" if resumed and resumed[-1].message else ""
    out.print(f"run {run.id} is {run.status.value} (attempt {run.attempt}){said}", highlight=False)
    _emit_or_follow(client, run, follow=follow, as_json=as_json, out=out)


@app.command()
def train(
    file: Annotated[str, typer.Argument(help="RunSpec as YAML or JSON")],
    checkpoint_dir: Annotated[Optional[str], typer.Option(
        "--checkpoint-dir", help="where checkpoints go, as DIR/runs/{name}/checkpoints; a re-run of the same spec "
        "resumes from the newest one (default: $TESSERA_HOME/local, i.e. .tessera/local); s3:// works too")] = None,
    no_checkpoints: Annotated[bool, typer.Option("--no-checkpoints", help="neither save nor resume")] = False,
    code: Annotated[Optional[str], typer.Option(
        "--code", help="a folder with the code that model.import, data.*.import and eval_metrics imports name, "
        "imported from where it lies")] = None,
    assignments: SetOption = None,
) -> None:
    """Run one spec locally without the service (for debugging); prints metrics as it goes.
    Saves checkpoints (every checkpoint.interval and at the end) and resumes from them; a spec trained to its
    end already prints its final metrics at once, training nothing.
    Ctrl-C or SIGTERM stops it (exit 130), ending its MLflow run KILLED; it says which checkpoint it kept."""
    from cli.lineage import BadAssignment
    from cli.specfile import SpecFileError, load_spec

    if code is not None:
        _require_folder(code)  # a usage error first
    try:
        # The folder is imported where it lies, never packed: any digest lets the spec validate.
        spec = load_spec(file, code_digest=None if code is None else LOCAL_CODE_DIGEST, assignments=assignments)
    except SpecFileError as exc:
        _fail(str(exc))
    except BadAssignment as exc:
        _fail(str(exc), EXIT_USAGE)
    try:
        from workers.checkpoint import IncompatibleCheckpoint
        from workers.local import default_checkpoint_dir, latest_local_checkpoint, local_run_url, train_local
    except ModuleNotFoundError as exc:
        needs_extra("workers", exc)
    if code is not None:
        _install_requirements(spec.code.requirements)  # first: pip must not import the user's modules
        _put_code_on_path(code)
        spec = spec.model_copy(update={"code": None})  # imported from the folder, not fetched from a service

    checkpoint_dir = None if no_checkpoints else checkpoint_dir or default_checkpoint_dir()
    latest = None
    if checkpoint_dir is not None:
        latest = latest_local_checkpoint(spec, checkpoint_dir)
        if latest is None:
            console.print(f"checkpoints go to {local_run_url(spec, checkpoint_dir)}/checkpoints", highlight=False,
                          soft_wrap=True)
        else:
            console.print(f"resuming from {latest.url} (batch {latest.step})", highlight=False, soft_wrap=True)
    try:
        with _sigterm_as_interrupt():
            result = train_local(spec, checkpoint_dir=checkpoint_dir)
    except IncompatibleCheckpoint as exc:
        _fail(f"{exc}\n(or pass another --checkpoint-dir, or --no-checkpoints)")
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, in process or on a local Ray (workers.local)
        err_console.print(_interrupted(spec, checkpoint_dir), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    if latest is not None and "train/loss" not in result:  # resumed at (or past) its end: no step trained
        err_console.print(f"nothing left to train: the run's newest checkpoint is at batch {latest.step}, at or past "
                          f"max_duration {spec.max_duration}; --set max_duration=... trains on from it, "
                          "--no-checkpoints or another --checkpoint-dir trains afresh", highlight=False, soft_wrap=True)
    console.print_json(json.dumps(result, default=float))


def _interrupted(spec: Any, checkpoint_dir: str | None) -> str:
    """The line a stopped ``tessera train`` ends with: what it kept, and how to go on from it."""
    if checkpoint_dir is None:
        return "interrupted; nothing was saved (--no-checkpoints)"
    from workers.local import latest_local_checkpoint

    try:
        latest = latest_local_checkpoint(spec, checkpoint_dir)
    except Exception as exc:  # an unreadable storage must not hide that the run stopped
        return f"interrupted; its checkpoints could not be listed ({type(exc).__name__}: {exc})"
    if latest is None:
        return "interrupted; no checkpoint was saved: training again starts afresh"
    # The same command, not one rebuilt here: its --checkpoint-dir, --set and --code pick the folder.
    return (f"interrupted; kept checkpoint {latest.url} (batch {latest.step}): the same tessera train command "
            "resumes from it")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, ``kill PID`` (SIGTERM) stops ``tessera train`` as Ctrl-C does: the run's
    loggers end their runs (MLflow's KILLED) and its sink is closed, instead of Python dying at
    once and leaving them RUNNING. SIGKILL still cannot be caught. A DDP run's private Ray
    replaces the handler with its own, and ``workers.local`` puts this one back once Ray runs
    (``workers.local_ray.signal_handlers_restored``). Outside the main thread, where no handler
    can be set, nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def interrupt(signum, frame) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _spec_file(file: str, assignments: list[str] | None, *, sweep: bool = False) -> dict:
    """The spec file's mapping with the ``--set`` changes; a file that cannot be read fails (exit
    1), a bad ``--set`` is a usage error (exit 2)."""
    from cli.lineage import BadAssignment
    from cli.specfile import SpecFileError, load_spec_dict

    try:
        return load_spec_dict(file, assignments, sweep=sweep)
    except SpecFileError as exc:
        _fail(str(exc))
    except BadAssignment as exc:
        _fail(str(exc), EXIT_USAGE)


def _require_folder(folder: str) -> None:
    """A ``--code`` that is no folder is a bad option value: a usage error (exit 2)."""
    from pathlib import Path

    if not Path(folder).expanduser().is_dir():
        _fail(f"--code {folder}: not a folder", EXIT_USAGE)


def _put_code_on_path(folder: str) -> None:
    """Make ``folder`` importable here and in local Ray workers: a package folder (with
    ``__init__.py``) by its parent, any other folder as a root of packages."""
    import os
    from pathlib import Path

    path = Path(folder).expanduser().resolve()
    root = str(path.parent if (path / "__init__.py").is_file() else path)
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


LOCAL_CODE_DIGEST = "0" * 64


def _install_requirements(requirements: list[str]) -> None:
    """Install a local run's ``code.requirements`` as a worker does, and make them importable
    here (after what is installed) and in local Ray workers (through ``PYTHONPATH``, so there
    before the installed packages, which the constraints keep apart)."""
    import os

    from workers.models.code_cache import UserCodeError
    from workers.models.user_requirements import importable_dirs, install_requirements

    if requirements:
        console.print(f"installing code.requirements {requirements} (once per machine)", highlight=False)
    try:
        folder = install_requirements(requirements)
    except UserCodeError as exc:  # pip's reason, or a code cache this user cannot trust
        _fail(str(exc))
    if folder is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"),
                                                                 *importable_dirs(folder)]))


def _status(run) -> str:
    """The status, and for a QUEUED run its place and why it waits: ``QUEUED #2 resources``."""
    if run.queue is None:
        return run.status.value
    return f"{run.status.value} #{run.queue.position} {run.queue.reason}"


METRIC_WIDTH = len("0.1234")  # _metric's figures below 10: a narrow terminal cuts other columns first


def _metric(summary: dict[str, float], key: str) -> str:
    """4 significant digits: a loss of 3e-05 printed with 4 decimals read 0.0000."""
    return f"{summary[key]:.4g}" if key in summary else "-"


# What a FAILED run's ``failure`` (RunView.failure) means for what to do next; nothing when not known.
FAILURE_HINTS = {
    "machine": "failed: the machine, not the code (Ray lost a worker process, a node or the job): "
               "`tessera resume {id}` may well pass",
    "code": "failed: the training raised it (its code, spec or data): a resume would fail again; fix it first",
}


def _print_summary(run) -> None:
    if run.summary:
        console.print("  ".join(f"{k}={v:.4g}" for k, v in sorted(run.summary.items())))
    if run.error:
        err_console.print(f"[red]error:[/red] {run.error}", highlight=False)
    if run.failure in FAILURE_HINTS:
        err_console.print(FAILURE_HINTS[run.failure].format(id=run.id), highlight=False, soft_wrap=True)


from cli.access import keys_app, projects_app  # noqa: E402  (sub-apps register after the commands above)
from cli.sweeps import sweeps_app  # noqa: E402

app.add_typer(keys_app, name="keys")
app.add_typer(projects_app, name="projects")
app.add_typer(sweeps_app, name="sweeps")


def main() -> None:
    app(prog_name="tessera")


if __name__ == "__main__":
    sys.exit(main())
