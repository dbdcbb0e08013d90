"""``tessera submit --follow``: a live progress bar fed by incremental metric polling."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from api.client import Client
from api.views import RunView


def follow_run(client: Client, run_id: str, *, console: Console, poll_interval: float = 1.0) -> RunView:
    """Show status, epoch/batch, loss and accuracy until the run ends; return its final view.

    Polls ``/metrics?after=`` so each request carries only new points.
    """
    latest: dict[str, float] = {}
    after = 0
    columns = (
        TextColumn("[bold]{task.fields[status]:<10}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TextColumn("ep {task.fields[epoch]} ba {task.fields[batch]}"),
        TextColumn("loss {task.fields[loss]}  acc {task.fields[acc]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(run_id, total=1.0, status="QUEUED", epoch="-", batch="-", loss="-", acc="-")
        while True:
            run = client.get_run(run_id)
            page = client.metrics(run_id, after=after)
            after = page.last_seq
            for point in page.data:
                latest[point.key] = point.value
            progress.update(
                task,
                completed=latest.get("time/progress", 0.0),
                status=run.status.value,
                epoch=_fmt_int(latest.get("time/epoch")),
                batch=_fmt_int(latest.get("time/batch")),
                loss=_fmt(latest.get("train/loss")),
                acc=_fmt(latest.get("eval/accuracy")),
            )
            if run.status.is_terminal:
                if run.status.value == "COMPLETED":
                    progress.update(task, completed=1.0)
                return run
            time.sleep(poll_interval)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _fmt_int(value: float | None) -> str:
    return "-" if value is None else str(int(value))
