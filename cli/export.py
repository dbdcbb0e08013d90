"""``tessera export RUN -o model.safetensors``: download a run's trained model as one file."""

from pathlib import Path
from typing import Annotated, Optional

import httpx
import typer

from api.credentials import find_api_key


def download_model(url: str, run_id: str, out: Path, *, fmt: str, step: int | None) -> tuple[int, str]:
    """Stream the run's export to ``out`` (written whole or not at all); return (bytes, step)."""
    params = {"format": fmt} | ({"step": step} if step is not None else {})
    partial = out.with_name(out.name + ".partial")
    key = find_api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.stream("GET", f"{url.rstrip('/')}/api/v1/runs/{run_id}/model", params=params, headers=headers,
                      timeout=300) as answer:
        if answer.status_code >= 400:
            answer.read()
            try:
                detail = answer.json().get("detail", answer.text)
            except ValueError:
                detail = answer.text
            raise typer.BadParameter(f"HTTP {answer.status_code}: {detail}", param_hint="RUN_ID")
        size = 0
        with open(partial, "wb") as file:
            for chunk in answer.iter_bytes():
                file.write(chunk)
                size += len(chunk)
        partial.replace(out)
        return size, answer.headers.get("x-tessera-step", "?")


def register(app: typer.Typer, url_option, default_url: str) -> None:
    """Add the ``export`` command to ``app``."""

    @app.command()
    def export(run_id: str, url: url_option = default_url,
               output: Annotated[Optional[Path], typer.Option("--output", "-o", help="file to write")] = None,
               format: Annotated[str, typer.Option(help="safetensors or torch")] = "safetensors",
               step: Annotated[Optional[int], typer.Option(help="exported step (default: the final one)")] = None,
               ) -> None:
        """Download a run's trained model (load it with workers.export.load_model)."""
        if format not in ("safetensors", "torch"):
            raise typer.BadParameter(f"{format!r}; use safetensors or torch", param_hint="--format")
        out = output or Path(f"{run_id}.{'pt' if format == 'torch' else 'safetensors'}")
        try:
            size, chosen = download_model(url, run_id, out, fmt=format, step=step)
        except httpx.HTTPError as exc:
            typer.echo(f"error: cannot reach the service: {exc}", err=True)
            raise typer.Exit(1)
        typer.echo(f"wrote {out} ({size} bytes, step {chosen})")
