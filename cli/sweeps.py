"""``tessera sweeps``: submit, list, show, cancel and wait for Ray Tune sweeps (README, "Sweeps")."""

from __future__ import annotations

import contextlib
from typing import Annotated, Optional

import typer
from rich.table import Table

sweeps_app = typer.Typer(no_args_is_help=True, help="Sweeps: submit a SweepSpec, list, show, logs, cancel, wait.")

from cli.output import (ID_WIDTH, STATUS_WIDTH, JsonOption, LimitOption, UrlOption, call, console, emit, fail,
                        first_items, following, kept, listing, none_listed, status_value)



def _client(url: str | None):
    from api.client import Client

    return Client(url)


@sweeps_app.command("submit")
def submit_sweep(
    file: Annotated[str, typer.Argument(help="SweepSpec as YAML or JSON")],
    wait: Annotated[bool, typer.Option("--wait", help="poll until the sweep ends (exit 1 unless COMPLETED)")] = False,
    code: Annotated[Optional[str], typer.Option(
        "--code", help="a folder with the code the base's imports (model, data, eval_metrics) name: packed "
        "(respecting its .gitignore), uploaded once, recorded as base.code.digest (every trial's code.digest)")] = None,
    project: Annotated[Optional[str], typer.Option(help="the project (default: the key's only one, "
                                                        "else 'default')")] = None,
    idempotency_key: Annotated[Optional[str], typer.Option(
        "--idempotency-key", help="submitting again with the same key (in the project) returns the first sweep "
        "instead of making a second; default: a fresh key, reused on this command's own retries")] = None,
    assignments: Annotated[Optional[list[str]], typer.Option(
        "--set", help="a change to the file's sweep, dotted.key=value (repeatable), e.g. base.max_duration=1ep, "
                      "base.algorithms.cutmix.alpha=0.5 (a method by its name), num_samples=4; a searched param's "
                      "dotted name goes whole: search.params='{optimizer.lr: {grid: [0.01, 0.1]}}'")] = None,
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Submit a sweep for the service to drive; its trials are runs (`tessera sweeps show ID` lists them).

    With --json, stdout is the SweepView as JSON (the final one with --wait; messages on stderr)."""
    from cli.main import _require_folder, _spec_file, _upload_code, _warn_of_unshipped_code
    from cli.output import err_console

    if code is not None:
        _require_folder(code)  # a usage error first
    body = _spec_file(file, assignments, sweep=True)  # --set base.max_duration=1ep changes the base
    client = _client(url)
    out = err_console if as_json else console  # with --json, stdout carries only the JSON
    if code is None:
        _warn_of_unshipped_code(body.get("base"), prefix="base.", spec_file=file)
    else:
        base = body.get("base")
        if not isinstance(base, dict):
            fail(f"--code {code}: {file} has no base run spec to record code.digest in: base must be a mapping "
                 f"(a RunSpec), got {'nothing' if base is None else type(base).__name__}")
        from api.code_package import with_code_digest

        body["base"] = with_code_digest(base, _upload_code(client, code, project=project, out=out))
    sweep = call(client.create_sweep, body, project=project, idempotency_key=idempotency_key)
    if sweep.replayed:
        out.print(f"sweep [bold]{sweep.id}[/bold] ({sweep.name}) was submitted earlier with this --idempotency-key: "
                  f"nothing new queued; status {sweep.status.value}", soft_wrap=True)
    else:
        out.print(f"submitted sweep [bold]{sweep.id}[/bold] ({sweep.name}) status {sweep.status.value}", soft_wrap=True)
    if not wait:
        emit(sweep, as_json=as_json, render=lambda: None)
    else:
        _wait(sweep.id, url, as_json=as_json)


@sweeps_app.command("list")
def list_sweeps(
    status: Annotated[Optional[str], typer.Option(help="only sweeps with this status (any case), e.g. running",
                                                  callback=lambda value: status_value(value, "SweepStatus"))] = None,
    name: Annotated[Optional[str], typer.Option(help="only sweeps whose name contains this")] = None,
    project: Annotated[Optional[str], typer.Option(help="only this project's sweeps (default: every project of "
                                                        "your key)")] = None,
    archived: Annotated[str, typer.Option(help="false (hide archived sweeps), true (only them) or all")] = "false",
    limit: LimitOption = "20",
    as_json: JsonOption = False,
    url: UrlOption = None,
) -> None:
    """Sweeps of your projects, newest first: status, trials done, best value (--json: a list of SweepViews)."""
    listed = call(first_items, _client(url).list_sweeps, limit, status=status, name=name, archived=archived,
                  project=project)

    def render() -> None:
        console.print(_sweeps_table(listed))
        if not listed:
            none_listed("sweeps", {"status": status, "name": name, "project": project}, archived=archived)

    emit(listed, as_json=as_json, render=render)


def _sweeps_table(sweeps) -> Table:
    table = listing(kept("id", ID_WIDTH), "name", kept("status", STATUS_WIDTH), "trials", "best", "metric")
    for sweep in sweeps:
        done = sum(n for status, n in sweep.counts.items() if status in ("COMPLETED", "FAILED", "STOPPED", "CANCELED"))
        best = next((t.metric for t in sweep.trials if t.run_id == sweep.best_run_id), None)
        table.add_row(sweep.id, sweep.name, _status(sweep), f"{done}/{len(sweep.trials)}",
                      f"{best:.4g}" if best is not None else "-", f"{sweep.metric} ({sweep.mode})")
    return table


@sweeps_app.command("show")
def show_sweep(sweep_id: str, as_json: JsonOption = False, url: UrlOption = None) -> None:
    """One sweep: status, trials (best first), the Pareto front and skipped sets."""
    sweep = call(_client(url).get_sweep, sweep_id)
    emit(sweep, as_json=as_json, render=lambda: _print_sweep(sweep))


def _print_sweep(sweep) -> None:
    console.print(f"[bold]{sweep.id}[/bold] {sweep.name}  status {_status(sweep)}  attempt {sweep.attempt}  "
                       f"project {sweep.project}", highlight=False)
    if sweep.error:
        console.print(f"error: {sweep.error}", highlight=False)
    table = listing(kept("run", ID_WIDTH), kept("status", STATUS_WIDTH), "algorithms", "params", f"best {sweep.metric}",
                    "wall s", "pareto")
    descending = sweep.mode == "max"
    ordered = sorted(sweep.trials, key=lambda t: (t.metric is None,
                                                  -(t.metric or 0) if descending else (t.metric or 0)))
    for trial in ordered:
        table.add_row(trial.run_id, trial.status.value, ",".join(trial.algorithms) or "-",
                      ", ".join(f"{k}={v}" for k, v in (trial.params or {}).items()) or "-",
                      f"{trial.metric:.4g}" if trial.metric is not None else "-",
                      _seconds(trial.wall_time_s),
                      "*" if trial.run_id in sweep.pareto else "")
    console.print(table)
    for skipped in sweep.skipped:
        console.print(f"skipped {skipped.algorithms}: {skipped.reason}", highlight=False)


def _seconds(value: float | None) -> str:
    """A trial's wall time: 0.7 s as 0.7 (not 1), 7,200 s as 7200 (not 7.2e+03)."""
    return "-" if value is None else f"{value:.3g}" if value < 100 else f"{value:.0f}"


@sweeps_app.command("cancel")
def cancel_sweep(sweep_id: str, url: UrlOption = None) -> None:
    """Cancel a sweep: its driver stops and its running trials end CANCELED."""
    sweep = call(_client(url).cancel_sweep, sweep_id)
    console.print(f"sweep {sweep.id}: {sweep.status.value}", highlight=False)


@sweeps_app.command("logs")
def sweep_logs(
    sweep_id: str,
    attempt: Annotated[Optional[int], typer.Option(help="driver attempt (default: the newest)")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing while the driver runs")] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
) -> None:
    """Print a sweep driver's log: the Tune driver's output and every trial's (one driver
    attempt; --json: the log so far as one page: sweep_id, attempt, text, size, live)."""
    from cli.logs import refuse_json_with_follow, show_logs, sweep_pages

    refuse_json_with_follow(as_json, follow)
    goes_on = following(f"sweep {sweep_id}", f"tessera sweeps cancel {sweep_id}", doing="following the log")
    with _client(url) as client, goes_on if follow else contextlib.nullcontext():
        show_logs(sweep_pages(client, sweep_id), attempt=attempt, follow=follow, as_json=as_json, call=call)


@sweeps_app.command("wait")
def wait_sweep(sweep_id: str, url: UrlOption = None) -> None:
    """Poll a sweep until it ends; exit 1 unless it COMPLETED."""
    _wait(sweep_id, url)


def _wait(sweep_id: str, url: str | None, *, as_json: bool = False) -> None:
    """Poll until the sweep ends and say how (stdout: the final SweepView with ``as_json``; the
    line on stderr then); exit 1 unless it COMPLETED."""
    from cli.output import err_console

    out = err_console if as_json else console
    with following(f"sweep {sweep_id}", f"tessera sweeps cancel {sweep_id}", doing="waiting"):
        sweep = call(_client(url).wait_sweep, sweep_id, timeout=7 * 86400, on_poll=_ProgressLines(out))
    out.print(f"sweep {sweep.id}: {sweep.status.value}, best run {sweep.best_run_id or '-'}", highlight=False)
    emit(sweep, as_json=as_json, render=lambda: None)
    if sweep.status.value != "COMPLETED":
        raise typer.Exit(1)


class _ProgressLines:
    """``sweeps wait``'s progress: a line each time the sweep's status, its trials' counts or
    its best run change (``RUNNING: 3 trials (1 RUNNING, 2 COMPLETED), best 5c1e... eval/accuracy
    0.9712``), nothing while they stay the same."""

    def __init__(self, out):
        self.out, self.last = out, None

    def __call__(self, sweep) -> None:
        line = _progress_line(sweep)
        if line != self.last:
            self.out.print(line, highlight=False, soft_wrap=True)
            self.last = line


def _progress_line(sweep) -> str:
    trials = sum(sweep.counts.values())
    counts = ", ".join(f"{n} {status}" for status, n in sorted(sweep.counts.items()))
    line = f"{_status(sweep)}: {trials} trial{'' if trials == 1 else 's'}" + (f" ({counts})" if counts else "")
    best = next((t for t in sweep.trials if t.run_id == sweep.best_run_id), None)
    if best is not None and best.metric is not None:
        line += f", best {best.run_id} {sweep.metric} {best.metric:.4g}"
    return line


def _status(sweep) -> str:
    if sweep.queue is None:
        return sweep.status.value
    return f"{sweep.status.value} #{sweep.queue.position} {sweep.queue.reason}"
