"""What a run has recorded, from the shell: ``tessera checkpoints RUN`` (its committed
checkpoints, the steps ``fork --from`` and ``export --step`` take), ``tessera metrics RUN
[--key K]`` (the latest value of each metric key; every point with --json) and ``tessera
children RUN`` (the runs forked from it)."""

# No `from __future__ import annotations`: typer reads the url_option annotation at runtime.

import json
from datetime import datetime, timezone
from typing import Annotated, Any, Optional

import typer

from cli.output import ID_WIDTH, STATUS_WIDTH, JsonOption, console, emit, err_console, kept, listing

# Points per GET /runs/{id}/metrics: the SDK's METRICS_PAGE_SIZE, which a test here makes smaller;
# not imported from api.client, which `tessera --help` must not load.
METRICS_PAGE = 10_000
STEP_WIDTH = len("100000")  # a batch number a user copies into `fork --from` or `export --step`
VALUE_WIDTH = len("2.51734e-05")  # a value as f"{v:.6g}" writes it
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def Client(url: str | None):  # noqa: N802  (the SDK, imported when a command runs: --help stays fast)
    from api.client import Client as SdkClient

    return SdkClient(url)


def all_metric_points(client, run_id: str, *, key: str | None = None, page_size: int | None = None) -> list:
    """Every point of the run (the surviving one per step, as the API lists them by default),
    oldest first, as ``Client.iter_metrics`` pages them (``page_size`` points a request, default
    ``METRICS_PAGE``); with ``key``, only that key's."""
    return list(client.iter_metrics(run_id, key=key, page_size=page_size or METRICS_PAGE))


def latest_by_key(points: list) -> dict[str, tuple[Any, int]]:
    """``{key: (its latest point, how many points it has)}``, keys sorted; latest by step, then
    by report order (``seq``)."""
    latest: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for point in points:
        counts[point.key] = counts.get(point.key, 0) + 1
        best = latest.get(point.key)
        if best is None or (point.step, point.seq) >= (best.step, best.seq):
            latest[point.key] = point
    return {key: (latest[key], counts[key]) for key in sorted(latest)}


def size_text(n: int) -> str:
    """Bytes as a short figure: ``812 B``, ``4.2 MiB``."""
    size, unit = float(n), "B"
    for larger in ("KiB", "MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, larger
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def duration_text(seconds: float) -> str:
    """A duration as the dashboard writes one (``formatDuration`` in the dashboard's ui.js: keep the
    two alike): ``45s``, ``12m 03s``, ``1h 14m``, ``3d 2h``."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    m = s // 60
    if m < 60:
        return f"{m}m {s % 60:02d}s"
    h = m // 60
    return f"{h}h {m % 60:02d}m" if h < 48 else f"{h // 24}d {h % 24}h"


def durations_line(run, now=None) -> str | None:
    """How long ``run`` (a RunView) trained, its waits between attempts left out, and beside it the
    wall-clock span from its first start where that reads otherwise: ``trained 15m 00s (1h 35m from
    first start to end, 2 attempts)``. The span alone from a service older than trained_seconds;
    None before the run first began training."""
    now = now or datetime.now(timezone.utc)  # one instant for both, or they may read a second apart
    span = run.span_seconds_at(now)
    if span is None:
        return None
    to = "end" if run.finished_at is not None else "now"
    trained = run.trained_seconds_at(now)
    if trained is None:
        return f"duration {duration_text(span)} (from first start to {to})"
    line = f"trained {duration_text(trained)}"
    if duration_text(span) != duration_text(trained):
        attempts = f"{run.attempt} attempt{'s' if run.attempt != 1 else ''}"
        line += f" ({duration_text(span)} from first start to {to}, {attempts})"
    return line


def patch_text(patch: dict[str, Any], prefix: str = "") -> str:
    """A fork's patch as the ``--set`` assignments that make it: ``optimizer.lr=0.05 max_duration=4ep``."""
    parts = []
    for key, value in patch.items():
        if isinstance(value, dict) and value:
            parts.append(patch_text(value, f"{prefix}{key}."))
        else:
            parts.append(f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}")
    return " ".join(parts)


def register(app: typer.Typer, url_option, call) -> None:
    """Add ``checkpoints``, ``metrics`` and ``children`` to ``app`` (``call`` turns API errors
    into one line and their exit code)."""

    @app.command()
    def checkpoints(run_id: str, url: url_option = None, as_json: JsonOption = False) -> None:
        """List a run's committed checkpoints, oldest first (--json: a list of CheckpointViews).

        Their steps are what `tessera fork --from` and `tessera export --step` take; checkpoint
        writes that failed are left out."""
        with Client(url) as client:
            committed = [view for view in call(client.list_checkpoints, run_id) if view.committed]

        def render() -> None:
            if not committed:
                console.print(f"run {run_id} has no committed checkpoint yet (the spec's checkpoint.interval says "
                              f"how often it saves one)", highlight=False, markup=False)
                return
            table = listing(kept("step", STEP_WIDTH), "epochs done", "attempt", "time", "size", "workers", "url")
            table.columns[-1].overflow = "fold"  # a URL whole, over two lines if it must
            for view in committed:
                table.add_row(str(view.step), str(view.epoch), str(view.attempt), view.time.strftime(TIME_FORMAT),
                              size_text(view.bytes), str(view.world_size), view.url)
            console.print(table)

        emit(committed, as_json=as_json, render=render)

    @app.command()
    def metrics(run_id: str,
                key: Annotated[Optional[str], typer.Option(help="only this metric key, e.g. eval/accuracy")] = None,
                url: url_option = None, as_json: JsonOption = False) -> None:
        """Show a run's metrics: the latest value of each key (--json: every point).

        The table has each key's latest step and value and how many points it has; --json prints
        every point, oldest first (seq, step, key, value, time, attempt), of --key alone if given."""
        with Client(url) as client:
            points = call(all_metric_points, client, run_id, key=key)

        def render() -> None:
            if not points:
                what = f"no points for key {key!r}" if key is not None else "no metric points yet"
                console.print(f"run {run_id} has {what}", highlight=False, markup=False)
                return
            table = listing("key", kept("step", STEP_WIDTH), kept("latest", VALUE_WIDTH), "points", "time")
            for name, (point, count) in latest_by_key(points).items():
                table.add_row(name, str(point.step), f"{point.value:.6g}", str(count),
                              point.time.strftime(TIME_FORMAT))
            console.print(table)

        emit(points, as_json=as_json, render=render)

    @app.command()
    def children(run_id: str, url: url_option = None, as_json: JsonOption = False) -> None:
        """List the runs forked from a run, oldest first (--json: a list of RunViews); the first 500.

        The table says where each started (the parent's batch, or scratch) and what it changed, as
        --set assignments. A continued run is the same run's next attempt, not a child."""
        from api.client import MAX_CHILDREN

        with Client(url) as client:
            forks = call(client.run_children, run_id)
        if len(forks) == MAX_CHILDREN:
            err_console.print(f"the first {MAX_CHILDREN} forks of run {run_id}, oldest first: it may have more",
                              highlight=False)

        def render() -> None:
            if not forks:
                console.print(f"run {run_id} has no forks (make one with `tessera fork {run_id} --set KEY=VALUE`)",
                              highlight=False, markup=False)
                return
            table = listing(kept("id", ID_WIDTH), "name", kept("status", STATUS_WIDTH), "attempt", "created", "from",
                            "changes")
            for run in forks:
                origin = f"batch {run.fork.step}" if run.fork and run.fork.step is not None else "scratch"
                table.add_row(run.id, run.name, run.status.value, str(run.attempt),
                              run.created_at.strftime(TIME_FORMAT), origin,
                              patch_text(run.fork.patch) if run.fork else "")
            console.print(table)

        emit(forks, as_json=as_json, render=render)
