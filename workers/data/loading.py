"""What both DataLoader-backed loaders (image_folder, webdataset) need from torch's DataLoader:
fail fast when a worker raises, and keep the trainer's global RNG untouched."""

from __future__ import annotations

from typing import Any, Iterator


def batches_failing_fast(loader: Any) -> Iterator[Any]:
    """Iterate a ``torch.utils.data.DataLoader``; when a worker's error surfaces, stop the worker
    processes at once. (torch's own shutdown after a worker exception waits 5 s per worker for
    workers that never exit, then terminates them: a bad shard would stall the run.)"""
    iterator = iter(loader)
    try:
        yield from iterator
    except Exception:
        for worker in getattr(iterator, "_workers", ()):
            if worker.is_alive():
                worker.terminate()
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        raise


def private_generator(seed: int, epoch: int) -> Any:
    """A DataLoader's own generator. Without one, every ``iter(DataLoader)`` draws its workers'
    base seed from torch's global RNG, which the trainer checkpoints for augmentations (CutMix,
    dropout): a loader created at a resume point would shift that stream and break bitwise resume."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)
