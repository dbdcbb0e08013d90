"""A pickle planted in checkpoint storage is refused with a clear error and never runs.

Each file a load reads gets the planted object in turn: ``trainer.pt`` (and ``rank{r}.pt``),
a DCP non-tensor item, and DCP's ``.metadata``. The payload would create a marker file when
unpickled; the marker must not exist afterwards.
"""

from __future__ import annotations

import io
import pickle
import re
import traceback

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

from tests.workers.test_checkpoint_reader import assert_same, load_with, state_to_save
from workers.checkpoint.reader import ParallelFsspecReader
from workers.checkpoint.safe_load import UnsafeCheckpoint, load_state


def _text(exc: BaseException) -> str:
    """The error as a user sees it: DCP wraps a rank's error, with its traceback, in its own."""
    return "".join(traceback.format_exception(exc))


class Planted:
    """Unpickling this opens (creates) ``marker``: stands for any code an attacker would run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_trainer_state_with_a_reduce_payload_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "ran"
    buffer = io.BytesIO()
    torch.save({"scheduler": {"last_epoch": 3}, "evil": Planted(str(marker))}, buffer)
    with pytest.raises(UnsafeCheckpoint, match=r"refusing to load .*trainer.pt: it refers to (io|builtins).open"):
        load_state(buffer.getvalue(), what="runs/x/checkpoints/ep1-ba10/trainer.pt")
    assert not marker.exists()


def test_trainer_state_with_numpy_rng_and_tensors_still_loads():
    import numpy as np
    import random

    state = {"numpy": np.random.get_state(), "python": random.getstate(), "torch": torch.get_rng_state(),
             "time": {"epoch": 2, "batch": 10}, "scale": 1.5}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    loaded = load_state(buffer.getvalue(), what="rank0.pt")
    assert loaded["numpy"][0] == "MT19937" and (loaded["numpy"][1] == state["numpy"][1]).all()
    assert loaded["python"] == state["python"] and torch.equal(loaded["torch"], state["torch"])


def test_fsdp_trainer_state_with_gathered_dtensors_still_loads():
    from torch.distributed.tensor import Replicate, Shard

    from workers.checkpoint.manager import _FullTensor, _from_bytes, _to_bytes

    state = {"ema": {"w": _FullTensor(torch.ones(4, 2), (Shard(0),)), "b": _FullTensor(torch.zeros(2), (Replicate(),))}}
    loaded = _from_bytes(_to_bytes(state), "trainer.pt")
    assert torch.equal(loaded["ema"]["w"].tensor, torch.ones(4, 2))
    assert loaded["ema"]["w"].placements == (Shard(0),) and loaded["ema"]["b"].placements == (Replicate(),)


def test_a_planted_non_tensor_item_in_a_dcp_checkpoint_is_refused(tmp_path):
    marker = tmp_path / "ran"
    saved = state_to_save()
    saved["extra"]["name"] = Planted(str(marker))  # stored as a pickled BYTE_IO item
    url = f"file://{tmp_path}/ckpt"
    dcp.save(saved, storage_writer=FsspecWriter(url), no_dist=True)
    with pytest.raises(BaseException) as refused:
        load_with(ParallelFsspecReader(url), state_to_save())
    assert re.search(r"refusing to load \S+\.distcp item extra\.name: it refers to (io|builtins)\.open", _text(refused.value))
    assert not marker.exists()


def test_a_planted_metadata_file_is_refused(tmp_path):
    marker = tmp_path / "ran"
    saved = state_to_save()
    url = f"file://{tmp_path}/ckpt"
    dcp.save(saved, storage_writer=FsspecWriter(url), no_dist=True)
    assert_same(load_with(ParallelFsspecReader(url), saved), saved)  # the honest file loads
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(Planted(str(marker))))
    with pytest.raises(BaseException) as refused:
        load_with(ParallelFsspecReader(url), saved)
    assert re.search(r"refusing to load \S+/\.metadata: it refers to (io|builtins)\.open", _text(refused.value))
    assert not marker.exists()
