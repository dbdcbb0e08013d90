"""A fork's first start loads its parent's checkpoint in one process: the weights always, the
optimizer state only for the same kind of optimizer (with the fork's own lr), from batch 0; a
fork's own checkpoint wins on its next attempt; a changed model is refused."""

from __future__ import annotations

import pytest
import torch

from api.lineage import ForkInfo
from tests.workers.checkpoint_helpers import latest_url
from tests.workers.helpers_specs import tiny_spec
from workers.checkpoint import IncompatibleCheckpoint
from workers.reporter import MemorySink
from workers.trainer import Trainer, train


def _parent(tmp_path) -> str:
    spec = tiny_spec(max_duration="4ba", deterministic=True, checkpoint={"interval": "2ba", "keep_last": 2})
    train(spec, checkpoint_url=f"file://{tmp_path}/parent", sink=MemorySink())
    return latest_url(f"file://{tmp_path}/parent")


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.state.model.state_dict().items()}


def _parent_weights(url: str) -> dict[str, torch.Tensor]:
    from workers.checkpoint import read_checkpoint

    return read_checkpoint(url)["model"]


def test_a_fork_starts_from_the_parent_s_weights_and_momentum_with_its_own_lr(tmp_path):
    source = _parent(tmp_path)
    child_spec = tiny_spec(max_duration="2ba", optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9})
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=4, load_optimizer=True)
    trainer = Trainer(child_spec, sink=MemorySink(), checkpoint_url=f"file://{tmp_path}/child", fork=fork)
    fresh = _weights(trainer)
    assert trainer.resume() == source
    loaded, saved = _weights(trainer), _parent_weights(source)
    assert all(torch.equal(loaded[key], saved[key]) for key in saved)
    assert any(not torch.equal(fresh[key], saved[key]) for key in saved)  # the load changed something
    assert trainer.state.timestamp.batch == 0  # new training, counted from batch 0
    group = trainer.state.optimizer.param_groups[0]
    assert group["initial_lr"] == 0.05 and group["momentum"] == 0.9
    assert all("momentum_buffer" in trainer.state.optimizer.state[p] for p in group["params"])


def test_a_fork_with_another_optimizer_loads_only_the_weights(tmp_path):
    source = _parent(tmp_path)
    child_spec = tiny_spec(max_duration="2ba", optimizer={"name": "adamw", "lr": 0.001})
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=4, load_optimizer=False)
    trainer = Trainer(child_spec, sink=MemorySink(), checkpoint_url=f"file://{tmp_path}/child", fork=fork)
    trainer.resume()
    saved = _parent_weights(source)
    assert all(torch.equal(_weights(trainer)[key], saved[key]) for key in saved)
    assert len(trainer.state.optimizer.state) == 0


def test_the_fork_s_own_checkpoint_wins_on_its_next_attempt(tmp_path):
    source = _parent(tmp_path)
    child_spec = tiny_spec(max_duration="3ba", checkpoint={"interval": "1ba", "keep_last": 2})
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=4, load_optimizer=True)
    child = f"file://{tmp_path}/child"
    sink = MemorySink()
    Trainer(child_spec, sink=sink, checkpoint_url=child, fork=fork).fit()
    assert [step for step, _ in sink.values("train/loss")] == [1, 2, 3]
    again = Trainer(child_spec, sink=MemorySink(), checkpoint_url=child, fork=fork)
    assert again.resume().endswith("ep0-ba3") and again.state.timestamp.batch == 3


def test_a_fork_of_another_model_is_refused_naming_the_field(tmp_path):
    source = _parent(tmp_path)
    other = tiny_spec(max_duration="2ba", model={"name": "simple_cnn", "params": {"width": 16, "hidden": 16}})
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=4, load_optimizer=True)
    trainer = Trainer(other, sink=MemorySink(), checkpoint_url=f"file://{tmp_path}/child", fork=fork)
    with pytest.raises(IncompatibleCheckpoint, match="model"):
        trainer.resume()
