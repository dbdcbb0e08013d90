"""``tessera export RUN -o model.safetensors``: download a run's trained model as one file;
``tessera exports RUN``: every export of the run and its state."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from cli.output import JsonOption, call, console, emit, fail


def register(app: typer.Typer, url_option) -> None:
    """Add the ``export`` and ``exports`` commands to ``app``."""

    @app.command()
    def export(run_id: str, url: url_option = None,
               output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write")] = None,
               format: Annotated[str, typer.Option(help="safetensors or torch")] = "safetensors",
               step: Annotated[Optional[int], typer.Option(
                   help="a committed checkpoint's step (default: the final export); exported first if needed")] = None,
               ) -> None:
        """Download a run's trained model (load it with workers.export.load_model). With --step,
        a checkpoint not exported yet is exported first by a Ray job, and the command waits for it."""
        if format not in ("safetensors", "torch"):
            raise typer.BadParameter(f"{format!r}; use safetensors or torch", param_hint="--format")
        out = output or Path(f"{run_id}.{'pt' if format == 'torch' else 'safetensors'}")
        from api.client import Client
        from api.errors import ExportFailed

        with Client(url) as client:
            if step is not None:
                try:
                    call(client.wait_export, run_id, step)
                except ExportFailed as exc:
                    fail(str(exc))
            size, chosen = call(client.download_model, run_id, out, fmt=format, step=step)
        typer.echo(f"wrote {out} ({size} bytes, step {chosen})")

    @app.command()
    def exports(run_id: str, url: url_option = None, as_json: JsonOption = False) -> None:
        """List the run's exports by step: READY (download with export --step), PENDING (a Ray job
        is making it) or FAILED with the job's error (export --step again retries it)."""
        from api.client import Client

        with Client(url) as client:
            listed = call(client.list_exports, run_id)

        def render() -> None:
            if not listed:
                console.print(f"run {run_id} has no export yet: its model is exported when training ends, and "
                              f"a committed checkpoint's with `tessera export {run_id} --step N`", highlight=False,
                              markup=False)
                return
            table = Table("step", "status", "formats", "job")
            table.columns[3].overflow = "fold"  # a job id whole, over two lines if it must
            for view in listed:
                table.add_row(str(view.step), view.status, ", ".join(view.formats), view.job_id or "")
            console.print(table)
            for view in listed:
                if view.error:  # the job's log tail, whole and as it is, below the table
                    console.print(f"\nstep {view.step} failed: {view.error}", highlight=False, markup=False,
                                  soft_wrap=True)

        emit(listed, as_json=as_json, render=render)
