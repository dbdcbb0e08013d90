"""``tessera data``: prepare your own data for a run.

``tessera data pack SRC DEST`` writes an image folder (``root/<class>/<image>``, local or
``s3://``) or a built-in data set (``fashion_mnist``, ``digits``) as WebDataset tar shards and
prints the ``data.train`` entry to paste into a spec. The packing code lives in
``workers.data.pack`` (torch, torchvision) and is imported only when the command runs.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Prepare your own data: pack it as shards.")
console = Console()
err_console = Console(stderr=True)


@app.command()
def pack(
    src: Annotated[str, typer.Argument(help="an image folder (path or s3:// URL) or fashion_mnist | digits")],
    dest: Annotated[str, typer.Argument(help="folder or s3://bucket/prefix for the shards")],
    shard_size: Annotated[int, typer.Option("--shard-size", min=1, help="samples per shard")] = 1000,
    split: Annotated[str, typer.Option(help="built-in data sets: train | test")] = "train",
    limit: Annotated[Optional[int], typer.Option(min=1, help="pack only the first N samples")] = None,
    name: Annotated[Optional[str], typer.Option(help="shard name prefix (default: the split)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the shuffle before packing")] = 0,
    root: Annotated[Optional[str], typer.Option(help="fashion_mnist: folder of its idx .gz files")] = None,
) -> None:
    """Write SRC as WebDataset shards ({key}.png + {key}.cls) under DEST; prints urls and num_samples."""
    if split not in ("train", "test"):
        err_console.print(f"[red]error:[/red] --split {split!r}: allowed are train, test", highlight=False)
        raise typer.Exit(2)
    try:
        from workers.data.errors import DataError
        from workers.data.pack import pack as pack_shards
    except ModuleNotFoundError as exc:
        from cli.output import needs_extra

        needs_extra("workers", exc)

    try:
        result = pack_shards(src, dest, shard_size=shard_size, split=split, limit=limit, name=name, seed=seed,
                             root=root)
    except (DataError, FileNotFoundError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1)
    console.print(f"wrote {result.num_samples} samples in {result.num_shards} shards", highlight=False)
    console.print(f"urls: {result.urls}", highlight=False, soft_wrap=True)
    console.print(f"num_samples: {result.num_samples}", highlight=False)
    console.print(f"spec entry (data.train or data.eval): {result.spec_snippet()}", highlight=False, soft_wrap=True)
