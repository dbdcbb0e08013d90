"""What a checkpoint holds besides the model and optimizer, and whether a run may load it.

- Per-rank RNG states (torch, numpy, python; CUDA where present): with the data position they
  make a resumed run draw exactly the augmentations and dropout masks the uninterrupted run drew.
- The fingerprint: the fields of the spec that shape the model and optimizer state (model,
  surgery algorithms, optimizer, classes and input channels). Not the number of workers, so a
  checkpoint loads on a different world size.
"""

from __future__ import annotations

import hashlib
import json
import random
from typing import Any, Iterable

import numpy as np
import torch

from api.algorithm_specs import surgery_identity


class IncompatibleCheckpoint(ValueError):
    """The checkpoint was written by a run whose model or optimizer state has another shape."""

    def __reduce__(self):
        return (type(self), (str(self),))


def rng_state(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                             "python": random.getstate()}
    if device.type == "cuda" and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def fingerprint(spec: Any, *, surgery: Iterable[Any], num_classes: int, in_channels: int) -> dict[str, Any]:
    """The spec fields a checkpoint's tensors depend on. ``surgery`` are the algorithm specs of
    the methods that change the model (their parameters change shapes, e.g. factorization ranks)."""
    return {
        "model": spec.model.model_dump(mode="json"),
        "surgery": [surgery_identity(s) for s in surgery],
        "optimizer": spec.optimizer.name,
        "num_classes": int(num_classes),
        "in_channels": int(in_channels),
    }


def spec_hash(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def check_compatible(saved: dict[str, Any], current: dict[str, Any], *, url: str) -> None:
    """Raise ``IncompatibleCheckpoint`` naming every field that differs."""
    differing = sorted(key for key in set(saved) | set(current) if saved.get(key) != current.get(key))
    if differing:
        details = "; ".join(f"{key}: checkpoint has {saved.get(key)!r}, this run has {current.get(key)!r}"
                            for key in differing)
        raise IncompatibleCheckpoint(
            f"checkpoint {url} was written by an incompatible run ({details}). Start a new run, or resume "
            "with the spec that wrote it.")
