"""Functional and event-form checks of the methods that act on gradients and on what is trained
(GradientClipping, LayerFreezing, SAM); ``test_functional_forms`` and ``test_algorithm_events`` merge
these dicts into their registry-parametrized tables."""

import pytest
import torch
import torch.nn.functional as F

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


# --- layer_freezing -----------------------------------------------------------------------


def freeze_layers_freezes_the_first_layers_on_a_linear_schedule_and_drops_them_from_the_optimizer():
    from algorithms.layer_freezing import freeze_schedule
    assert freeze_schedule(0.5, 0.5, 1.0) == 0.0 and freeze_schedule(0.75, 0.5, 0.8) == pytest.approx(0.4)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4),
                                torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert af.freeze_layers(model, optimizer, 0.4, freeze_start=0.5) == (0, 0.0)
    assert all(p.requires_grad for p in model.parameters())
    depth, fraction = af.freeze_layers(model, optimizer, 0.9, freeze_start=0.5, freeze_level=1.0)
    assert (depth, fraction) == (2, pytest.approx(0.8))  # int(0.8 * 3 freezable layers)
    frozen = {id(p) for m in (model[0], model[2]) for p in m.parameters()}
    assert all(p.requires_grad == (id(p) not in frozen) for p in model.parameters())
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()} - frozen
    af.freeze_layers(model, None, 1.0, freeze_start=0.0)  # everything but the head; never the head
    assert [p.requires_grad for p in model[3][1].parameters()] == [True, True]


def layer_freezing_stops_updating_the_first_layers_from_an_epoch_end_and_skips_their_backward():
    trainer = run_for({"name": "layer_freezing", "freeze_start": 0.0}, max_duration="2ep")  # 4 batches per epoch
    model = trainer.state.model
    first, second = model.features[0], model.features[3]
    seen = []

    class Snapshot:
        def run_event(self, event, state):
            if event is Event.BATCH_END:
                seen.append((first.weight.detach().clone(), second.weight.detach().clone(), first.weight.grad))
    trainer.engine.callbacks.append(Snapshot())
    trainer.fit()
    # At the first epoch end (progress 0.5) int(0.5 * 3) = 1 layer freezes: the first conv;
    # at the last (progress 1) all 3 layers before the head.
    assert trainer.state.algorithms[0].frozen_layers == 3
    assert not first.weight.requires_grad and not second.weight.requires_grad
    assert all(p.requires_grad for p in model.head[3].parameters())
    moves = [not torch.equal(a[0], b[0]) for a, b in zip(seen, seen[1:])]
    assert moves == [True, True, True, False, False, False, False]  # not even momentum moves it
    assert all(not torch.equal(a[1], b[1]) for a, b in zip(seen, seen[1:]))
    assert all(grad is None for _, _, grad in seen[4:])  # no gradient computed once frozen


# --- sam ----------------------------------------------------------------------------------


def sam_optimizer_steps_with_the_gradient_at_the_ascended_weights():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    model = torch.nn.Linear(3, 1)
    w0 = [p.detach().clone() for p in model.parameters()]

    def loss_at(params):
        return ((x @ params[0].T + params[1] - y) ** 2).mean()
    # Expected: g at w; e = rho g / |g|; the step uses the gradient at w + e, applied to w.
    w = [t.clone().requires_grad_() for t in w0]
    g = torch.autograd.grad(loss_at(w), w)
    norm = torch.sqrt(sum((t ** 2).sum() for t in g))
    ascended = [(t + 0.5 * gt / norm).requires_grad_() for t, gt in zip(w0, g)]
    g_sam = torch.autograd.grad(loss_at(ascended), ascended)
    expected = [t - 0.1 * gt for t, gt in zip(w0, g_sam)]

    optimizer = af.SAMOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), rho=0.5, interval=1)

    def closure():
        optimizer.zero_grad()
        loss = loss_at(list(model.parameters()))
        loss.backward()
        return loss
    optimizer.step(closure)
    assert all(torch.allclose(p, e, atol=1e-6) for p, e in zip(model.parameters(), expected))
    plain = af.SAMOptimizer(torch.optim.SGD(torch.nn.Linear(3, 1).parameters(), lr=0.1), interval=2)
    calls = []
    plain.step(lambda: calls.append(1))  # step 1 of interval 2: one pass only
    plain.step(lambda: calls.append(1))
    assert len(calls) == 3 and plain.state_dict()["global_step"] == 2


class BatchAtStep(Algorithm):
    """Appended last: at AFTER_TRAIN_BATCH it runs first, before SAM, and keeps what SAM starts from."""

    events = frozenset({Event.AFTER_TRAIN_BATCH, Event.AFTER_DATALOADER})

    def __init__(self):
        self.seen = []

    def apply(self, event, state):
        if event is Event.AFTER_DATALOADER:
            self.batch = (state.inputs.clone(), state.targets.clone())
            return
        self.seen.append(([p.detach().clone() for p in state.model.parameters()],
                          [p.grad.clone() for p in state.model.parameters()], self.batch))


def sam_steps_with_the_batchs_gradient_at_the_ascended_weights():
    import copy
    trainer = run_for({"name": "sam", "rho": 0.2})
    probe, final = BatchAtStep(), []
    trainer.engine.algorithms.append(probe)

    class Final:
        def run_event(self, event, state):
            if event is Event.AFTER_TRAIN_BATCH:
                final.append(([p.detach().clone() for p in state.model.parameters()],
                              [p.grad.clone() for p in state.model.parameters()]))
    trainer.engine.callbacks.append(Final())
    trainer.fit()
    for (weights, grads, (x, y)), (weights_after, sam_grads) in zip(probe.seen, final):
        assert all(torch.equal(a, b) for a, b in zip(weights, weights_after))  # restored exactly
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
        ascended = copy.deepcopy(trainer.state.model)
        with torch.no_grad():
            for p, w, g in zip(ascended.parameters(), weights, grads):
                p.copy_(w + 0.2 * g / norm)
        trainer.state.loss_fn(ascended(x), y).backward()
        assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(ascended.parameters(), sam_grads))
        assert any(not torch.allclose(a, b) for a, b in zip(grads, sam_grads))


def sam_runs_two_passes_per_step_with_microbatches_and_the_fp16_grad_scaler():
    trainer = run_for({"name": "sam", "interval": 1}, precision="amp_fp16", microbatch_size=8)
    forwards = []

    class Forwards:
        def run_event(self, event, state):
            if event is Event.BEFORE_FORWARD:
                forwards.append(state.inputs.shape[0])
    trainer.engine.callbacks.append(Forwards())
    final = trainer.fit()
    assert forwards == [8] * 12  # 3 batches x 2 microbatches x 2 passes
    assert trainer.state.scaler.get_scale() > 1 and torch.isfinite(torch.tensor(final["train/loss"]))
    assert all(torch.isfinite(p).all() for p in trainer.state.model.parameters())


# --- seq_length_warmup --------------------------------------------------------------------


def set_batch_sequence_length_truncates_or_reshapes_rows():
    x = torch.arange(24).reshape(2, 12)
    y = x + 100
    short_x, short_y = af.set_batch_sequence_length((x, y), 5)
    assert torch.equal(short_x, x[:, :5]) and torch.equal(short_y, y[:, :5])
    rows = af.set_batch_sequence_length(x, 5, truncate=False)  # 12 tokens -> two rows of 5 (2 dropped)
    assert torch.equal(rows, torch.stack([x[0, :5], x[0, 5:10], x[1, :5], x[1, 5:10]]))
    assert af.set_batch_sequence_length(x, 12) is x
    batch = af.set_batch_sequence_length({"input_ids": x, "note": "kept"}, 3)
    assert batch["input_ids"].shape == (2, 3) and batch["note"] == "kept"
    from algorithms.seq_length_warmup import current_sequence_length
    # Composer's schedule: 100 batches, warm-up over 30, from 8 to 32 in steps of 8: every 10 batches.
    lengths = [current_sequence_length(b, 100, 0.3, 8, 32, 8) for b in (0, 9, 10, 25, 30, 99)]
    assert lengths == [8, 8, 16, 24, 32, 32]


def seq_length_warmup_grows_the_rows_a_text_model_trains_on():
    trainer = run_for({"name": "seq_length_warmup", "duration": 0.5, "min_seq_length": 4, "max_seq_length": 16,
                       "step_size": 4}, max_duration="8ba",
                      model={"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                             "max_seq_len": 16}},
                      data={"train": {"name": "shakespeare", "seq_len": 16, "limit": 64}, "batch_size": 8})
    shapes = []

    class Shapes:
        def run_event(self, event, state):
            if event is Event.BEFORE_FORWARD:
                shapes.append((tuple(state.inputs.shape), tuple(state.targets.shape)))
    trainer.engine.callbacks.append(Shapes())
    trainer.fit()
    # Warm-up over 4 of 8 batches, 3 steps of 4 tokens: one step per batch, then full length.
    assert [s[0][1] for s in shapes] == [4, 8, 12, 16, 16, 16, 16, 16]
    assert all(x == y and x[0] == 8 for x, y in shapes)


# --- selective_backprop -------------------------------------------------------------------


def select_using_loss_keeps_high_loss_examples_more_often():
    torch.manual_seed(0)
    x = torch.zeros(8, 4)
    x[:, 0] = torch.arange(8.0)  # the model below scores example i with loss i
    y = torch.zeros(8, dtype=torch.long)

    def loss_fun(out, target, reduction="none"):
        return out[:, 0]
    counts = torch.zeros(8)
    for _ in range(400):
        xs, ys = af.select_using_loss(x, y, torch.nn.Identity(), loss_fun, keep=0.25)
        assert xs.shape == (2, 4) and ys.shape == (2,) and len(set(xs[:, 0].tolist())) == 2
        counts[xs[:, 0].long()] += 1
    # Probability ~ percentile^3: the highest-loss example is picked far more often than the lowest.
    assert counts[7] > counts[4] > counts[0] and counts[7] > 250 and counts[0] < 5
    from algorithms.selective_backprop import per_example_loss, should_select
    logits, labels = torch.randn(3, 5), torch.tensor([1, 0, 4])
    assert torch.allclose(per_example_loss(logits, labels), F.cross_entropy(logits, labels, reduction="none"))
    assert [should_select(p, b, 0.5, 0.9, 2) for p, b in ((0.4, 4), (0.5, 5), (0.6, 6), (0.9, 8))] == \
        [False, False, True, False]


def selective_backprop_trains_on_the_selection_in_its_window():
    trainer = run_for({"name": "selective_backprop", "start": 0.5, "end": 1.0, "keep": 0.25, "interval": 1},
                      max_duration="4ba")
    sizes = []

    class Sizes:
        def run_event(self, event, state):
            if event is Event.BEFORE_FORWARD:
                sizes.append(state.inputs.shape[0])
    trainer.engine.callbacks.append(Sizes())
    trainer.fit()
    assert sizes == [16, 16, 4, 4]  # progress 0, 0.25: whole batches; 0.5, 0.75: a quarter


PROPERTY_CHECKS = {
    "gradient_clipping": [norm_clipping_scales_the_global_norm_down_to_the_threshold_and_keeps_small_gradients,
                          value_clipping_clamps_each_element,
                          adaptive_clipping_bounds_each_units_gradient_by_its_weight_norm],
    "layer_freezing": [freeze_layers_freezes_the_first_layers_on_a_linear_schedule_and_drops_them_from_the_optimizer],
    "sam": [sam_optimizer_steps_with_the_gradient_at_the_ascended_weights],
    "seq_length_warmup": [set_batch_sequence_length_truncates_or_reshapes_rows],
    "selective_backprop": [select_using_loss_keeps_high_loss_examples_more_often],
}

EVENT_CHECKS = {
    "gradient_clipping": [gradient_clipping_clips_the_whole_batchs_unscaled_gradient_once_before_the_step],
    "layer_freezing": [layer_freezing_stops_updating_the_first_layers_from_an_epoch_end_and_skips_their_backward],
    "sam": [sam_steps_with_the_batchs_gradient_at_the_ascended_weights,
            sam_runs_two_passes_per_step_with_microbatches_and_the_fp16_grad_scaler],
    "seq_length_warmup": [seq_length_warmup_grows_the_rows_a_text_model_trains_on],
    "selective_backprop": [selective_backprop_trains_on_the_selection_in_its_window],
}

FUNCTIONAL_NAMES = {"gradient_clipping": "apply_gradient_clipping", "layer_freezing": "freeze_layers",
                    "sam": "SAMOptimizer", "seq_length_warmup": "set_batch_sequence_length",
                    "selective_backprop": "select_using_loss"}
