"""Event-form checks of the surgery methods inside short real training runs (strategy none).

Imported into ``test_algorithm_events.EVENT_CHECKS``.
"""

import torch

from algorithms.blurpool import BlurConv2d, BlurMaxPool2d
from algorithms.events import Event
from algorithms.factorize import FactorizedConv2d
from api.specs import RunSpec
from workers.models.gpt import AlibiCausalSelfAttention
from workers.parallel import unwrap
from workers.trainer import Trainer


def text_run(*algorithm_specs, max_duration="4ba", seq_len=32, **params) -> Trainer:
    """A Trainer (not yet fitted): a 2-layer gpt_small on 32-character Shakespeare windows."""
    return Trainer(RunSpec.model_validate({
        "name": "text-events",
        "model": {"name": "gpt_small", "params": {"n_layer": 2, "n_head": 4, "d_model": 32, "max_seq_len": 32,
                                                  **params}},
        "data": {"train": {"name": "shakespeare", "seq_len": seq_len, "limit": 256},
                 "eval": {"name": "shakespeare", "split": "test", "seq_len": seq_len, "limit": 16},
                 "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 0.01},
        "max_duration": max_duration,
        "algorithms": list(algorithm_specs),
    }))


def vision_run(model, *algorithm_specs, image_size=16, max_duration="3ba") -> Trainer:
    return Trainer(RunSpec.model_validate({
        "name": "vision-events",
        "model": model,
        "data": {"train": {"name": "synthetic", "num_samples": 64, "image_size": image_size, "num_classes": 4},
                 "batch_size": 16},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "max_duration": max_duration,
        "algorithms": list(algorithm_specs),
    }))


class Record:
    """A callback keeping ``read(state)`` at the watched events."""

    def __init__(self, *events, read):
        self.events, self.read, self.seen = set(events), read, []

    def run_event(self, event, state):
        if event in self.events:
            self.seen.append(self.read(state))


def alibi_converts_gpt_small_at_init_and_trains_on_shorter_sequences():
    trainer = text_run({"name": "alibi", "max_sequence_length": 64, "train_sequence_length_scaling": 0.5},
                       max_duration="30ba")
    model = unwrap(trainer.state.model)
    assert model.wpe.weight.shape == (64, 32) and not model.wpe.weight.any() and not model.wpe.weight.requires_grad
    assert all(type(block.attn) is AlibiCausalSelfAttention for block in model.blocks)
    optimized = {id(p) for group in trainer.state.optimizer.param_groups for p in group["params"]}
    assert id(model.wpe.weight) in optimized  # built after surgery: sees the new (frozen) embedding
    shapes = Record(Event.BEFORE_FORWARD, read=lambda s: (tuple(s.inputs.shape), tuple(s.targets.shape)))
    losses = Record(Event.AFTER_LOSS, read=lambda s: s.loss.item())
    trainer.engine.callbacks.extend([shapes, losses])
    final = trainer.fit()
    # (8, 32) windows become (16, 16): the same tokens in rows half as long.
    assert set(shapes.seen) == {((16, 16), (16, 16))}
    assert sum(losses.seen[-5:]) / 5 < sum(losses.seen[:5]) / 5 - 0.5  # it learns
    assert {"eval/loss", "eval/accuracy", "eval/perplexity"} <= set(final)
    assert final["eval/perplexity"] < 84  # better than uniform over the 84 characters, on 32-char rows
    assert not model.wpe.weight.any()  # frozen: still zero after training


def alibi_with_scaling_one_keeps_the_batches():
    trainer = text_run({"name": "alibi", "max_sequence_length": 32, "train_sequence_length_scaling": 1.0})
    shapes = Record(Event.BEFORE_FORWARD, read=lambda s: tuple(s.inputs.shape))
    trainer.engine.callbacks.append(shapes)
    trainer.fit()
    assert set(shapes.seen) == {(8, 32)}


def blurpool_blurs_maxpools_and_strided_convs_at_init_and_trains():
    cnn = vision_run({"name": "simple_cnn", "params": {"width": 8, "hidden": 16}}, {"name": "blurpool"})
    assert isinstance(unwrap(cnn.state.model).features[2], BlurMaxPool2d)
    final = cnn.fit()
    assert torch.isfinite(torch.tensor(final["train/loss"]))
    resnet = vision_run({"name": "cifar_resnet20"}, {"name": "blurpool", "min_channels": 16})
    model = unwrap(resnet.state.model)
    assert sum(isinstance(m, BlurConv2d) for m in model.modules()) == 2
    before = [p.detach().clone() for p in model.parameters()]
    resnet.fit()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()) if b.requires_grad)


def factorize_factorizes_wide_convs_at_init_and_trains():
    trainer = vision_run({"name": "cifar_resnet20"},
                         {"name": "factorize", "min_channels": 32, "latent_channels": 0.25, "min_features": 32},
                         image_size=8)
    model = unwrap(trainer.state.model)
    factorized = [m for m in model.modules() if isinstance(m, FactorizedConv2d)]
    # Stage 2 (32 channels) and stage 3 (64 channels): 6 convs each, minus each stage's first conv1
    # whose input has half the channels (16 -> 32: min 16 < 32; 32 -> 64 qualifies).
    assert len(factorized) == 11
    assert {m.latent_channels for m in factorized} == {8, 16}
    optimized = {id(p) for group in trainer.state.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}
    final = trainer.fit()
    assert torch.isfinite(torch.tensor(final["train/loss"]))


SURGERY_EVENT_CHECKS = {
    "alibi": [alibi_converts_gpt_small_at_init_and_trains_on_shorter_sequences,
              alibi_with_scaling_one_keeps_the_batches],
    "blurpool": [blurpool_blurs_maxpools_and_strided_convs_at_init_and_trains],
    "factorize": [factorize_factorizes_wide_convs_at_init_and_trains],
}
