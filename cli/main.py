"""``tessera``: serve, submit, runs, show, cancel, train.

The client commands talk to the service at ``--url`` (env ``TESSERA_URL``, default
http://127.0.0.1:8000). ``serve`` and ``train`` import the service / the workers lazily, so the
client commands work where only the SDK is installed.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from api.client import Client
from api.errors import ApiError, format_detail
from cli.data import app as data_app
from cli.export import register as register_export
from cli.lineage import register as register_lineage
from cli.logs import register as register_logs
from cli.specfile import SpecFileError, load_spec, load_spec_dict

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Tessera: fast PyTorch training runs as a service.")
console = Console()
err_console = Console(stderr=True)
app.add_typer(data_app, name="data")

UrlOption = Annotated[str, typer.Option("--url", envvar="TESSERA_URL", help="service base URL")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _client(url: str) -> Client:
    return Client(url)


def _call(fn, *args, **kwargs):
    """Run an SDK call, turning API and connection errors into one clear line."""
    import httpx

    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        _fail(f"HTTP {exc.status_code}\n{format_detail(exc.detail)}")
    except httpx.HTTPError as exc:
        _fail(f"cannot reach the service: {exc}")


register_logs(app, UrlOption, DEFAULT_URL, _call)
register_export(app, UrlOption, DEFAULT_URL)
register_lineage(app, UrlOption, DEFAULT_URL, _call, console)


@app.command()
def serve(
    host: Annotated[Optional[str], typer.Option(help="bind address (env TESSERA_HOST)")] = None,
    port: Annotated[Optional[int], typer.Option(help="port (env TESSERA_PORT)")] = None,
) -> None:
    """Run the control plane (API, dispatcher, dashboard) with settings from TESSERA_* env vars."""
    from service.main import run

    run(host=host, port=port)


@app.command()
def submit(
    file: Annotated[str, typer.Argument(help="RunSpec as YAML or JSON")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="show live progress until the run ends")] = False,
    code: Annotated[Optional[str], typer.Option(
        "--code", help="a folder with the code model.import names: packed (respecting its .gitignore), "
        "uploaded once, recorded as the spec's code.digest")] = None,
    project: Annotated[Optional[str], typer.Option(help="the project (default: the key's only one, "
                                                        "else 'default')")] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Submit a run; with --follow, watch it until it ends (exit 1 unless COMPLETED)."""
    try:
        body = load_spec_dict(file)
    except SpecFileError as exc:
        _fail(str(exc))
    client = _client(url)
    if code is not None:
        body["code"] = {"digest": _upload_code(client, code, project=project)}
    run = _call(client.create_run, body, project=project)
    console.print(f"submitted run [bold]{run.id}[/bold] ({run.name}) status {run.status.value}")
    if not follow:
        return
    from cli.follow import follow_run

    final = _call(follow_run, client, run.id, console=console)
    _print_summary(final)
    if final.status.value != "COMPLETED":
        raise typer.Exit(1)


def _upload_code(client: Client, folder: str, *, project: str | None = None) -> str:
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
    console.print(f"code package {package.digest[:12]} ({len(package.files)} files, {len(package.data) / 1024:.1f} "
                  f"KiB) {what}", highlight=False)
    return package.digest


@app.command()
def runs(
    status: Annotated[Optional[str], typer.Option(help="only runs with this status")] = None,
    limit: Annotated[int, typer.Option(help="how many (newest first)")] = 20,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """List runs, newest first."""
    page = _call(_client(url).list_runs, status=status, limit=limit)
    table = Table("id", "name", "status", "attempt", "created", "eval/accuracy", "train/loss")
    for run in page.data:
        table.add_row(run.id, run.name, _status(run), str(run.attempt), run.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      _metric(run.summary, "eval/accuracy"), _metric(run.summary, "train/loss"))
    console.print(table)


@app.command()
def show(run_id: str, url: UrlOption = DEFAULT_URL,
         as_json: Annotated[bool, typer.Option("--json", help="print the RunView as JSON")] = False) -> None:
    """Show one run: status, times, summary, error and its status events."""
    client = _client(url)
    run = _call(client.get_run, run_id)
    if as_json:
        console.print_json(run.model_dump_json())
        return
    console.print(f"[bold]{run.id}[/bold] {run.name}  status {run.status.value}  attempt {run.attempt}")
    console.print(f"created {run.created_at}  started {run.started_at}  finished {run.finished_at}")
    console.print(f"project {run.project}", highlight=False)
    if run.parent_id is not None:
        origin = f"its checkpoint at batch {run.fork.step}" if run.fork and run.fork.step is not None else "scratch"
        console.print(f"forked from {run.parent_id} ({origin})", highlight=False)
    if run.queue is not None:
        console.print(f"queue: position {run.queue.position}, waiting for {run.queue.reason}"
                      + (f" ({run.queue.detail})" if run.queue.detail else ""), highlight=False)
    _print_summary(run)
    events = _call(client.run_events, run_id)
    table = Table("time", "from", "to", "attempt", "message")
    for event in events.data:
        table.add_row(str(event.time), event.from_status.value if event.from_status else "-", event.to_status.value,
                      str(event.attempt), event.message or "")
    console.print(table)


@app.command()
def cancel(run_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Cancel a run (its Ray job is stopped)."""
    run = _call(_client(url).cancel_run, run_id)
    console.print(f"run {run.id} is {run.status.value}")


@app.command()
def train(
    file: Annotated[str, typer.Argument(help="RunSpec as YAML or JSON")],
    checkpoint_dir: Annotated[Optional[str], typer.Option(
        "--checkpoint-dir", help="where checkpoints go, as DIR/runs/{name}/checkpoints; a re-run of the same spec "
        "resumes from the newest one (default: $TESSERA_HOME/local, i.e. .tessera/local); s3:// works too")] = None,
    no_checkpoints: Annotated[bool, typer.Option("--no-checkpoints", help="neither save nor resume")] = False,
    code: Annotated[Optional[str], typer.Option(
        "--code", help="a folder with the code model.import names, imported from where it lies")] = None,
) -> None:
    """Run one spec locally without the service (for debugging); prints metrics as it goes.
    Saves checkpoints (every checkpoint.interval and at the end) and resumes from them."""
    try:
        spec = load_spec(file)
    except SpecFileError as exc:
        _fail(str(exc))
    if code is not None:
        spec = spec.model_copy(update={"code": None})  # imported from the folder, not fetched from a service
        _put_code_on_path(code)
    from workers.checkpoint import IncompatibleCheckpoint
    from workers.local import default_checkpoint_dir, latest_local_checkpoint, local_run_url, train_local

    checkpoint_dir = None if no_checkpoints else checkpoint_dir or default_checkpoint_dir()
    if checkpoint_dir is not None:
        latest = latest_local_checkpoint(spec, checkpoint_dir)
        if latest is None:
            console.print(f"checkpoints go to {local_run_url(spec, checkpoint_dir)}/checkpoints", highlight=False,
                          soft_wrap=True)
        else:
            console.print(f"resuming from {latest.url} (batch {latest.step})", highlight=False, soft_wrap=True)
    try:
        result = train_local(spec, checkpoint_dir=checkpoint_dir)
    except IncompatibleCheckpoint as exc:
        _fail(f"{exc}\n(or pass another --checkpoint-dir, or --no-checkpoints)")
    console.print_json(json.dumps(result, default=float))


def _put_code_on_path(folder: str) -> None:
    """Make ``folder`` importable here and in local Ray workers: a package folder (with
    ``__init__.py``) by its parent, any other folder as a root of packages."""
    import os
    from pathlib import Path

    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        _fail(f"--code {folder}: not a folder")
    root = str(path.parent if (path / "__init__.py").is_file() else path)
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


def _status(run) -> str:
    """The status, and for a QUEUED run its place and why it waits: ``QUEUED #2 resources``."""
    if run.queue is None:
        return run.status.value
    return f"{run.status.value} #{run.queue.position} {run.queue.reason}"


def _metric(summary: dict[str, float], key: str) -> str:
    return f"{summary[key]:.4f}" if key in summary else "-"


def _print_summary(run) -> None:
    if run.summary:
        console.print("  ".join(f"{k}={v:.4g}" for k, v in sorted(run.summary.items())))
    if run.error:
        err_console.print(f"[red]error:[/red] {run.error}", highlight=False)


from cli.access import keys_app, projects_app  # noqa: E402  (sub-apps register after the commands above)

app.add_typer(keys_app, name="keys")
app.add_typer(projects_app, name="projects")


def main() -> None:
    app(prog_name="tessera")


if __name__ == "__main__":
    sys.exit(main())
