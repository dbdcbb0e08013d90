"""``tessera sweeps``: submit, list, show, cancel and wait for Ray Tune sweeps (README, "Sweeps")."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

sweeps_app = typer.Typer(no_args_is_help=True, help="Sweeps: submit a SweepSpec, list, show, cancel, wait.")

UrlOption = Annotated[str, typer.Option("--url", envvar="TESSERA_URL", help="service base URL")]
DEFAULT_URL = "http://127.0.0.1:8000"
JsonOption = Annotated[bool, typer.Option("--json", help="print the API's JSON instead of a table")]


def _main():
    from cli import main  # the shared client and error handling

    return main


@sweeps_app.command("submit")
def submit_sweep(
    file: Annotated[str, typer.Argument(help="SweepSpec as YAML or JSON")],
    wait: Annotated[bool, typer.Option("--wait", help="poll until the sweep ends (exit 1 unless COMPLETED)")] = False,
    project: Annotated[Optional[str], typer.Option(help="the project (default: the key's only one, "
                                                        "else 'default')")] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Submit a sweep for the service to drive; its trials are runs (`tessera sweeps show ID` lists them)."""
    from cli.specfile import SpecFileError, load_spec_dict

    main = _main()
    try:
        body = load_spec_dict(file)
    except SpecFileError as exc:
        main._fail(str(exc))
    sweep = main._call(main._client(url).create_sweep, body, project=project)
    main.console.print(f"submitted sweep [bold]{sweep.id}[/bold] ({sweep.name}) status {sweep.status.value}")
    if wait:
        _wait(sweep.id, url)


@sweeps_app.command("list")
def list_sweeps(limit: Annotated[int, typer.Option(help="how many (newest first)")] = 20,
                as_json: JsonOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """Sweeps of your projects, newest first: status, trials done, best value."""
    main = _main()
    page = main._call(main._client(url).list_sweeps, limit=limit)
    if as_json:
        main.console.print_json(page.model_dump_json())
        return
    table = Table("id", "name", "status", "trials", "best", "metric")
    for sweep in page.data:
        done = sum(n for status, n in sweep.counts.items() if status in ("COMPLETED", "FAILED", "STOPPED", "CANCELED"))
        best = next((t.metric for t in sweep.trials if t.run_id == sweep.best_run_id), None)
        table.add_row(sweep.id, sweep.name, _status(sweep), f"{done}/{len(sweep.trials)}",
                      f"{best:.4g}" if best is not None else "-", f"{sweep.metric} ({sweep.mode})")
    main.console.print(table)


@sweeps_app.command("show")
def show_sweep(sweep_id: str, as_json: JsonOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """One sweep: status, trials (best first), the Pareto front and skipped sets."""
    main = _main()
    sweep = main._call(main._client(url).get_sweep, sweep_id)
    if as_json:
        main.console.print_json(sweep.model_dump_json())
        return
    main.console.print(f"[bold]{sweep.id}[/bold] {sweep.name}  status {_status(sweep)}  attempt {sweep.attempt}  "
                       f"project {sweep.project}", highlight=False)
    if sweep.error:
        main.console.print(f"error: {sweep.error}", highlight=False)
    table = Table("run", "status", "algorithms", "params", sweep.metric, "wall s", "pareto")
    descending = sweep.mode == "max"
    ordered = sorted(sweep.trials, key=lambda t: (t.metric is None,
                                                  -(t.metric or 0) if descending else (t.metric or 0)))
    for trial in ordered:
        table.add_row(trial.run_id, trial.status.value, ",".join(trial.algorithms) or "-",
                      ", ".join(f"{k}={v}" for k, v in (trial.params or {}).items()) or "-",
                      f"{trial.metric:.4g}" if trial.metric is not None else "-",
                      f"{trial.wall_time_s:.0f}" if trial.wall_time_s is not None else "-",
                      "*" if trial.run_id in sweep.pareto else "")
    main.console.print(table)
    for skipped in sweep.skipped:
        main.console.print(f"skipped {skipped.algorithms}: {skipped.reason}", highlight=False)


@sweeps_app.command("cancel")
def cancel_sweep(sweep_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Cancel a sweep: its driver stops and its running trials end CANCELED."""
    main = _main()
    sweep = main._call(main._client(url).cancel_sweep, sweep_id)
    main.console.print(f"sweep {sweep.id}: {sweep.status.value}", highlight=False)


@sweeps_app.command("wait")
def wait_sweep(sweep_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Poll a sweep until it ends; exit 1 unless it COMPLETED."""
    _wait(sweep_id, url)


def _wait(sweep_id: str, url: str) -> None:
    main = _main()
    sweep = main._call(main._client(url).wait_sweep, sweep_id, timeout=7 * 86400)
    main.console.print(f"sweep {sweep.id}: {sweep.status.value}, best run {sweep.best_run_id or '-'}", highlight=False)
    if sweep.status.value != "COMPLETED":
        raise typer.Exit(1)


def _status(sweep) -> str:
    if sweep.queue is None:
        return sweep.status.value
    return f"{sweep.status.value} #{sweep.queue.position} {sweep.queue.reason}"
