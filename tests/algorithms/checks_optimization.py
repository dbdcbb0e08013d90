"""Functional and event-form checks of the methods that act on gradients and on what is trained
(GradientClipping, LayerFreezing); ``test_functional_forms`` and ``test_algorithm_events`` merge
these dicts into their registry-parametrized tables."""

import pytest
import torch

import algorithms.functional as af
from algorithms.base import Algorithm
from algorithms.events import Event
from api.specs import RunSpec
from workers.trainer import Trainer


def run_for(*algorithm_specs, max_duration="3ba", model=None, **overrides) -> Trainer:
    """A Trainer (not fitted) on 8x8 synthetic images; ``overrides`` are RunSpec fields."""
    return Trainer(RunSpec.model_validate({
        "name": "optimization-checks",
        "model": model or {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
        "data": {"train": {"name": "synthetic", "num_samples": 64, "image_size": 8, "num_classes": 4},
                 "batch_size": 16},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "max_duration": max_duration, "algorithms": list(algorithm_specs), "seed": 5, **overrides,
    }))


def global_norm(parameters) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters if p.grad is not None])).item()


# --- gradient_clipping --------------------------------------------------------------------


def linear_with_grads(scale: float = 1.0):
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 3)
    layer.weight.grad = torch.randn(3, 6) * scale
    layer.bias.grad = torch.randn(3) * scale
    return layer


def norm_clipping_scales_the_global_norm_down_to_the_threshold_and_keeps_small_gradients():
    layer = linear_with_grads(10.0)
    direction = torch.cat([layer.weight.grad.flatten(), layer.bias.grad]) / global_norm(layer.parameters())
    af.apply_gradient_clipping(layer, "norm", 0.5)
    assert global_norm(layer.parameters()) == pytest.approx(0.5, rel=1e-4)
    clipped = torch.cat([layer.weight.grad.flatten(), layer.bias.grad])
    assert torch.allclose(clipped / clipped.norm(), direction, atol=1e-6)  # the direction is kept
    small = linear_with_grads(1e-3)
    before = small.weight.grad.clone()
    af.apply_gradient_clipping(small.parameters(), "norm", 0.5)
    assert torch.equal(small.weight.grad, before)


def value_clipping_clamps_each_element():
    layer = linear_with_grads(3.0)
    expected = layer.weight.grad.clamp(-0.2, 0.2)
    af.apply_gradient_clipping(layer.weight, "value", 0.2)
    assert torch.equal(layer.weight.grad, expected)
    assert layer.bias.grad.abs().max() > 0.2  # only the tensor given was clipped
    with pytest.raises(ValueError, match="clipping_type 'nope'"):
        af.apply_gradient_clipping(layer, "nope", 0.2)


def adaptive_clipping_bounds_each_units_gradient_by_its_weight_norm():
    layer = linear_with_grads(1.0)
    with torch.no_grad():
        layer.weight[0].mul_(1000.0)  # row 0's gradient is small next to its weights: kept
        layer.bias.zero_()  # a zero bias: the 1e-3 floor still lets it learn
    row0 = layer.weight.grad[0].clone()
    af.apply_gradient_clipping(layer, "adaptive", 0.05)
    ratios = layer.weight.grad.norm(dim=1) / layer.weight.detach().norm(dim=1)
    assert torch.all(ratios <= 0.05 + 1e-6) and torch.equal(layer.weight.grad[0], row0)
    assert ratios[1:].tolist() == pytest.approx([0.05, 0.05], rel=1e-4)  # big gradients land on the bound
    assert layer.bias.grad.norm().item() == pytest.approx(0.05 * 1e-3, rel=1e-4)


class GradNorms(Algorithm):
    """Appended last: at AFTER_TRAIN_BATCH (an after-event) it runs first, before the clipping."""

    events = frozenset({Event.AFTER_TRAIN_BATCH})

    def __init__(self):
        self.norms, self.scales = [], []

    def apply(self, event, state):
        self.norms.append(global_norm(state.model.parameters()))
        self.scales.append(state.scaler.get_scale())


def gradient_clipping_clips_the_whole_batchs_unscaled_gradient_once_before_the_step():
    # fp16 with a GradScaler and two microbatches: the clipping must see the accumulated,
    # unscaled gradient (a scaled one is ~65536 times larger).
    trainer = run_for({"name": "gradient_clipping", "clipping_threshold": 0.05}, precision="amp_fp16",
                      microbatch_size=8)
    before = GradNorms()
    trainer.engine.algorithms.append(before)
    after = []

    class Clipped:
        def run_event(self, event, state):
            if event is Event.AFTER_TRAIN_BATCH:
                after.append(global_norm(state.model.parameters()))
    trainer.engine.callbacks.append(Clipped())
    trainer.fit()
    assert len(before.norms) == len(after) == 3  # once per batch, not per microbatch
    assert all(s > 1 for s in before.scales)  # a real GradScaler was scaling the loss
    assert all(0.05 < n < 100 for n in before.norms)  # unscaled values, above the threshold
    assert after == pytest.approx([0.05] * 3, rel=1e-3)


PROPERTY_CHECKS = {
    "gradient_clipping": [norm_clipping_scales_the_global_norm_down_to_the_threshold_and_keeps_small_gradients,
                          value_clipping_clamps_each_element,
                          adaptive_clipping_bounds_each_units_gradient_by_its_weight_norm],
}

EVENT_CHECKS = {
    "gradient_clipping": [gradient_clipping_clips_the_whole_batchs_unscaled_gradient_once_before_the_step],
}

FUNCTIONAL_NAMES = {"gradient_clipping": "apply_gradient_clipping"}
