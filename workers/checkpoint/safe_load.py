"""Load checkpoint files without running code planted in them.

Storage is shared and may be written by others, and a pickle can call any function while it
loads. So every file a checkpoint load reads is unpickled with an allow-list:

- ``trainer.pt`` / ``rank{r}.pt`` and DCP's non-tensor items (optimizer hyperparameters):
  ``torch.load(weights_only=True)`` with numpy's RNG-state types allowed (``load_state``);
- DCP's ``.metadata``: a pickle of ``torch.distributed.checkpoint`` dataclasses, read with an
  unpickler that only finds those classes, torch's dtypes/layouts/sizes and a few builtins
  (``load_metadata``).

A file that names anything else is refused with ``UnsafeCheckpoint`` naming the file and the
global, and nothing in it runs.
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import numpy as np
import torch


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file refers to a global outside the allow-list; it was not loaded."""


def _numpy_globals() -> list[Any]:
    from numpy.core.multiarray import _reconstruct  # numpy keeps the old path as an alias

    names = [_reconstruct, np.ndarray, np.dtype]
    names += [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    try:
        from numpy._core.multiarray import _reconstruct as core_reconstruct
        names.append(core_reconstruct)
    except ImportError:
        pass
    return names


SAFE_STATE_GLOBALS = _numpy_globals()


def _placement_globals() -> list[Any]:
    """DTensor placements: FSDP runs keep them next to gathered tensors in ``trainer.pt``."""
    from torch.distributed.tensor import placement_types

    return [getattr(placement_types, n) for n in ("Shard", "Replicate", "Partial", "_StridedShard")
            if hasattr(placement_types, n)]


def load_state(data: bytes, *, what: str, extra_globals: list[Any] = ()) -> Any:
    """``torch.load`` of ``data`` (a file this package saved) that refuses arbitrary objects;
    ``extra_globals``: the saving code's own plain classes that may appear too."""
    try:
        with torch.serialization.safe_globals([*SAFE_STATE_GLOBALS, *_placement_globals(), *extra_globals]):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is a long how-to-bypass text; keep the line that names the global.
        named = re.search(r"Unsupported global: GLOBAL ([\w.]+)|Unsupported operand \d+|Unsupported class [\w.]+",
                          str(exc))
        reason = f"it refers to {named[1]}" if named and named[1] else (named[0] if named else "unsupported content")
        raise UnsafeCheckpoint(f"refusing to load {what}: {reason}, which is outside the checkpoint allow-list "
                               f"(torch.load weights_only=True)") from None


_BUILTINS = {("builtins", n) for n in ("set", "frozenset", "slice", "object", "tuple", "list", "dict", "int",
                                          "float", "str", "bytes", "complex", "bool")}
_ALLOWED = _BUILTINS | {("collections", "OrderedDict"), ("copyreg", "_reconstructor"),
                        ("torch", "Size"), ("torch.serialization", "_get_layout")}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, what: str):
        super().__init__(file)
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint.") or (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                            torch.memory_format)):
            return getattr(torch, name)
        raise UnsafeCheckpoint(f"refusing to load {self.what}: it refers to {module}.{name}, which is not "
                               f"a checkpoint metadata type")


def load_metadata(file: Any, *, what: str) -> Any:
    """DCP's ``.metadata`` pickle, read with the allow-listed unpickler."""
    return _MetadataUnpickler(file, what).load()

