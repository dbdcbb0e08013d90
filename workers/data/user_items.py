"""``UserItems``: your own data set's items, each checked as it is read, in the rank or in a loader
worker process.

Kept apart from ``workers.data.user_data`` (which imports the user's callable) so that the fork
server preloads only this and torch (``workers.data.loading``): a loader worker unpickles a
``UserItems`` without importing the model registry. With ``num_workers`` > 0 the user's data set
is pickled once, in the rank (``pickled``), and unpickled in each loader worker, whose
``sys.path`` first gets the rank's entries (the code package's folder, its requirements).
"""

from __future__ import annotations

import contextlib
import operator
import pickle
import random
import sys
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Dataset

from algorithms.targets import IGNORE_INDEX

ALLOWED_ITEM = ("an (inputs, label) pair: inputs a floating tensor, an image (C, H, W) or a feature vector (F,), "
                "and label an integer")
ALLOWED_TOKENS = ("a (tokens, targets) pair: two integer tensors of shape (seq_len,), token ids (a target may be "
                  f"{IGNORE_INDEX}: that position counts for nothing, e.g. padding)")


def _user_code_error(message: str) -> Exception:
    from workers.models.code_cache import UserCodeError  # only on failure: it imports the model registry

    return UserCodeError(message)


def _tail(exc: BaseException) -> str:
    from workers.models.user_code import error_with_tail

    return error_with_tail(exc)


class UserItems(Dataset):
    """The user's data set, read by ``(index, epoch)``, each item checked: ``(inputs, label)``
    with ``inputs`` of ``shape`` (the first item's) and ``label`` in ``[0, num_classes)``; for
    ``task`` language_model ``(tokens, targets)``, both of ``shape`` ``(seq_len,)``, token ids in
    ``[0, num_classes)`` (the vocabulary), and targets -100 (``IGNORE_INDEX``) where ignored."""

    def __init__(self, dataset: Any, *, where: str, num_classes: int, shape: tuple[int, ...] | None = None,
                 seed: int = 0, task: str = "classification", seq_len_field: str = "seq_len"):
        self.dataset, self.where, self.num_classes = dataset, where, num_classes
        self.shape, self.seed, self.task, self.seq_len_field = shape, seed, task, seq_len_field
        self._payload: bytes | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def read(self, index: int, epoch: int = 0) -> tuple[torch.Tensor, int]:
        """Item ``index`` in ``epoch``, checked; ``UserCodeError`` naming it otherwise. Read with
        torch's, NumPy's and ``random``'s global generators seeded from ``(seed, epoch, index)``
        and restored after: a data set that augments at random gives the same item whichever
        process reads it and whenever (a resumed run continues exactly), and the training
        process's own random state is left as it was."""
        at = f"{self.where}: item {index}"
        try:
            with _seeded(self.seed, epoch, index):
                item = self.dataset[index]
        except Exception as exc:
            raise _user_code_error(f"{at}: reading it failed: {_tail(exc)}") from None
        if self.task == "language_model":
            return self._tokens(item, at)
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise _user_code_error(f"{at} is {_shown(item)}; allowed: {ALLOWED_ITEM}")
        inputs, label = item
        if not isinstance(inputs, torch.Tensor):
            raise _user_code_error(f"{at}: inputs are a {type(inputs).__name__}; allowed: {ALLOWED_ITEM}")
        if inputs.dim() not in (1, 3):
            raise _user_code_error(f"{at}: inputs have shape {tuple(inputs.shape)}; allowed: an image (C, H, W) (a "
                                   "grayscale (H, W) image: inputs.unsqueeze(0)) or a feature vector (F,)")
        if not inputs.is_floating_point():
            raise _user_code_error(f"{at}: inputs are {inputs.dtype}; allowed: a floating tensor (e.g. "
                                   "inputs.float() / 255 for 8-bit images)")
        if self.shape is not None and tuple(inputs.shape) != self.shape:
            raise _user_code_error(f"{at}: inputs have shape {tuple(inputs.shape)} but item 0 has {self.shape}; every "
                                   "item must have one shape (resize or pad them in the data set)")
        try:
            if isinstance(label, bool) or (isinstance(label, torch.Tensor) and label.is_floating_point()):
                raise TypeError
            number = operator.index(label.item() if isinstance(label, torch.Tensor) and label.dim() == 0 else label)
        except (TypeError, ValueError):
            raise _user_code_error(f"{at}: label {_shown(label)} is not an integer; allowed: an integer in "
                                   f"[0, {self.num_classes})") from None
        if not 0 <= number < self.num_classes:
            raise _user_code_error(f"{at}: label {number} is outside [0, {self.num_classes}) (num_classes "
                                   f"{self.num_classes}); allowed: an integer in [0, {self.num_classes})")
        return inputs, number

    def _tokens(self, item: Any, at: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A language-model item checked: ``(tokens, targets)`` as int64, each of ``shape``."""
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise _user_code_error(f"{at} is {_shown(item)}; allowed: {ALLOWED_TOKENS}")
        checked = []
        for name, ids in zip(("tokens", "targets"), item):
            if not isinstance(ids, torch.Tensor):
                raise _user_code_error(f"{at}: {name} are a {type(ids).__name__}; allowed: {ALLOWED_TOKENS}")
            if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise _user_code_error(f"{at}: {name} are {ids.dtype}; allowed: integer token ids (e.g. "
                                       "torch.tensor(ids, dtype=torch.long))")
            if tuple(ids.shape) != self.shape:
                raise _user_code_error(f"{at}: {name} have shape {tuple(ids.shape)}; allowed: {self.shape} "
                                       f"({self.seq_len_field} tokens; cut or pad them in the data set, or change "
                                       f"{self.seq_len_field})")
            ids = ids.long()  # compared as what the loss reads (uint8 holds no -100: it wraps to 156)
            if name == "targets":  # IGNORE_INDEX marks a position that counts for nothing (padding)
                kept = ids[ids != IGNORE_INDEX]
                if kept.numel() == 0:
                    raise _user_code_error(f"{at}: every target is {IGNORE_INDEX} (ignored), so the item trains "
                                           f"nothing; allowed: {ALLOWED_TOKENS}, at least one target kept")
            else:
                kept = ids
            low, high = int(kept.min()), int(kept.max())  # seq_len >= 2 ids; targets keep one at least
            if low < 0 or high >= self.num_classes:
                bad = low if low < 0 else high
                allowed = f"ids in [0, {self.num_classes})" + (f", and {IGNORE_INDEX} to ignore a position"
                                                                if name == "targets" else "")
                raise _user_code_error(f"{at}: {name} hold token id {bad}, outside [0, {self.num_classes}) (the "
                                       f"vocabulary, num_classes {self.num_classes}); allowed: {allowed}")
            checked.append(ids)
        return checked[0], checked[1]

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, Any]:
        return self.read(*item)

    def pickled(self) -> "UserItems":
        """Pickle the data set now, once, for loader worker processes; ``UserCodeError`` if it cannot be."""
        try:
            self._payload = pickle.dumps(self.dataset, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise _user_code_error(f"{self.where}: num_workers > 0 sends the data set to loader worker processes by "
                                   f"pickle, and pickling it failed ({type(exc).__name__}: {exc}); make it picklable "
                                   "(no open files, lambdas or local classes) or set num_workers: 0") from None
        return self

    def __getstate__(self) -> dict[str, Any]:
        if self._payload is None:
            self.pickled()
        return {"where": self.where, "num_classes": self.num_classes, "shape": self.shape, "seed": self.seed,
                "task": self.task, "seq_len_field": self.seq_len_field, "payload": self._payload,
                "sys_path": list(sys.path)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A loader worker: the rank's import path, in the rank's order (the code package's folder
        # first, its requirements after the installed packages), then whatever else it has.
        sys.path[:] = state["sys_path"] + [entry for entry in sys.path if entry not in state["sys_path"]]
        self.where, self.num_classes, self.shape = state["where"], state["num_classes"], state["shape"]
        self.seed, self.task, self.seq_len_field = state["seed"], state["task"], state["seq_len_field"]
        self._payload = state["payload"]
        self.dataset = pickle.loads(self._payload)


@contextlib.contextmanager
def _seeded(seed: int, epoch: int, index: int) -> Iterator[None]:
    """torch's, NumPy's and ``random``'s global generators seeded from ``(seed, epoch, index)``
    inside, restored after."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    key = [seed, epoch, index]
    item_seed = np.random.SeedSequence(key).generate_state(1)[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(item_seed))
        random.seed(hash(tuple(key)))
        np.random.seed(item_seed)
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _shown(value: Any) -> str:
    text = repr(value)
    return f"a {type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def collate_items(items: list[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of checked items: inputs stacked, and labels (integers) or targets (token ids) stacked."""
    targets = [i[1] for i in items]
    labels = torch.stack(targets) if isinstance(targets[0], torch.Tensor) else torch.tensor(targets, dtype=torch.int64)
    return torch.stack([i[0] for i in items]), labels
