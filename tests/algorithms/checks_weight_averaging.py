"""Functional and event-form checks of the weight-averaging methods (EMA, SWA);
``test_functional_forms`` and ``test_algorithm_events`` merge these dicts into their
registry-parametrized tables."""

import copy
import types

import pytest
import torch
from torch.optim.swa_utils import update_bn

import algorithms.functional as af
from algorithms.base import Algorithm
from algorithms.ema import EMA
from algorithms.events import Event
from algorithms.swa import SWA, average_bn_stats_across_ranks
from tests.algorithms.checks_augmentations import trainer_for
from workers.parallel import unwrap


def bn_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 2))


def perturbed(model, seed):
    other = copy.deepcopy(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for t in (*other.parameters(), *other.buffers()):
            if t.is_floating_point():
                t.add_(torch.randn_like(t))
            else:
                t.add_(seed)
    return other


# --- ema ----------------------------------------------------------------------------------


def ema_follows_the_exact_update_rule_for_parameters_and_buffers():
    model, ema_model = bn_net(), perturbed(bn_net(), 1)
    before = copy.deepcopy(ema_model.state_dict())
    af.compute_ema(model, ema_model, smoothing=0.9)
    for name, value in ema_model.state_dict().items():
        current = model.state_dict()[name]
        if value.is_floating_point():
            assert torch.allclose(value, 0.9 * before[name] + 0.1 * current, atol=1e-6), name
        else:
            assert torch.equal(value, current), name  # counters are copied, not averaged
    # The same rule on a {name: tensor} dict, which is what the EMA algorithm keeps.
    averaged = {k: v.clone() for k, v in before.items()}
    af.compute_ema(model, averaged, smoothing=0.9)
    assert all(torch.allclose(averaged[k], v) for k, v in ema_model.state_dict().items())


def ema_smoothing_is_zero_or_one_at_the_extremes_and_half_life_halves():
    model, ema_model = bn_net(), perturbed(bn_net(), 2)
    kept = copy.deepcopy(ema_model.state_dict())
    af.compute_ema(model, ema_model, smoothing=1.0)
    assert all(torch.equal(v, kept[k]) for k, v in ema_model.state_dict().items() if v.is_floating_point())
    af.compute_ema(model, ema_model, smoothing=0.0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in ema_model.state_dict().items())
    assert EMA(half_life="10ba").smoothing == pytest.approx(2 ** -0.1)
    assert EMA(half_life="10ba", update_interval="5ba").smoothing == pytest.approx(0.5 ** 0.5)
    assert EMA(half_life="10ba").smoothing ** 10 == pytest.approx(0.5)  # an old weight's share halves
    with pytest.raises(ValueError, match="same unit"):
        EMA(half_life="10ba", update_interval="1ep")


# --- swa ----------------------------------------------------------------------------------


def swa_average_is_the_mean_of_the_snapshots():
    snapshots = [perturbed(bn_net(), seed) for seed in range(1, 6)]
    averaged, count = copy.deepcopy(snapshots[0]), 0
    for snapshot in snapshots:
        count = af.update_swa(averaged, snapshot, count)
    assert count == 5
    for name, value in averaged.named_parameters():
        mean = torch.stack([dict(s.named_parameters())[name] for s in snapshots]).mean(0)
        assert torch.allclose(value, mean, atol=1e-6), name


def swa_recomputes_batchnorm_statistics_as_the_average_over_the_batches():
    model = bn_net()
    model[1].running_mean.fill_(5.0)
    batches = [torch.randn(8, 3, 6, 6) + i for i in range(3)]
    af.recompute_bn_stats(model, batches)
    features = torch.cat([model[0](b) for b in batches])  # the conv before the BatchNorm
    assert torch.allclose(model[1].running_mean, features.mean(dim=(0, 2, 3)), atol=1e-5)
    per_batch_var = torch.stack([model[0](b).var(dim=(0, 2, 3)) for b in batches]).mean(0)
    assert torch.allclose(model[1].running_var, per_batch_var, atol=1e-4)
    assert model.training  # update_bn restores the mode


def bn_net_1d_and_2d():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 6), torch.nn.BatchNorm1d(6))


def buffers_equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))


def swa_bn_stats_equal_torch_update_bn_on_the_same_loader():
    data = torch.utils.data.TensorDataset(torch.randn(40, 3, 6, 6) * 3 + 1, torch.randint(0, 2, (40,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8)  # (inputs, targets) pairs, as a train loader
    ours, theirs = bn_net_1d_and_2d(), bn_net_1d_and_2d()
    assert af.recompute_bn_stats(ours, loader) == 5  # every batch of the loader
    update_bn(loader, theirs)
    assert buffers_equal(ours, theirs) and ours[5].num_batches_tracked == 5
    # Bounded: the first num_batches batches, exactly as update_bn on those alone.
    bounded, first_two = bn_net_1d_and_2d(), bn_net_1d_and_2d()
    assert af.recompute_bn_stats(bounded, loader, num_batches=2) == 2
    update_bn([batch for _, batch in zip(range(2), loader)], first_two)
    assert buffers_equal(bounded, first_two) and not buffers_equal(bounded, theirs)
    with pytest.raises(ValueError, match="num_batches 0 must be >= 1, or None"):
        af.recompute_bn_stats(bn_net(), loader, num_batches=0)


def swa_at_swa_end_passes_over_bn_update_batches_of_the_training_data():
    model, pulled = bn_net(), []

    def train_batches():
        for i in range(10):
            pulled.append(i)
            yield torch.randn(4, 3, 6, 6) + i, torch.zeros(4, dtype=torch.long)

    state = types.SimpleNamespace(model=model, train_batches=train_batches,
                                  timestamp=types.SimpleNamespace(epoch=1))
    swa = SWA(swa_start="0ep", swa_end="1ep", update_interval="1ep", bn_update_batches=3)
    swa.apply(Event.EPOCH_END, state)
    assert swa.completed and pulled == [0, 1, 2]  # bounded: the rest is never read
    assert model[1].num_batches_tracked == 3
    state.train_batches = None  # outside a Trainer: nothing to pass over, and it says so
    with pytest.warns(UserWarning, match="no training data to recompute BatchNorm statistics"):
        SWA(swa_start="0ep", swa_end="1ep", update_interval="1ep").apply(Event.EPOCH_END, state)
    with pytest.raises(ValueError, match="bn_update_batches 0 must be >= 1, or None for a whole epoch"):
        SWA(bn_update_batches=0)


def swa_bn_stats_averaged_over_ranks_are_update_bn_over_all_their_batches():
    """Two ranks' passes, each over its own shard, then the all-reduce (here a stand-in that adds
    the other rank's statistics, as a two-rank SUM would): update_bn over both shards together."""
    torch.manual_seed(1)
    shards = [[torch.randn(8, 3, 6, 6) * (1 + r) + r + i for i in range(3)] for r in range(2)]
    ranks = [bn_net_1d_and_2d() for _ in range(2)]
    for model, shard in zip(ranks, shards):
        af.recompute_bn_stats(model, shard, sync_ranks=False)
    other = {id(a): b for a, b in zip(ranks[0].buffers(), ranks[1].buffers())}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        patch.setattr(torch.distributed, "get_world_size", lambda: 2)
        patch.setattr(torch.distributed, "all_reduce", lambda t, op: t.add_(other[id(t)]))
        average_bn_stats_across_ranks(ranks[0])
    together = bn_net_1d_and_2d()
    update_bn(shards[0] + shards[1], together)
    for name, got in ranks[0].named_buffers():
        want = dict(together.named_buffers())[name]
        if got.is_floating_point():
            assert torch.allclose(got, want, atol=1e-5), name


def swa_recompute_bn_stats_syncs_ranks_only_when_asked():
    """The functional form defaults to no collective (safe on rank 0 alone, as Composer's); the
    SWA algorithm, on every rank, asks for one; and the runtime's buffer averaging is the same helper."""
    from workers.parallel import average_buffers
    reduced = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.distributed, "is_initialized", lambda: True)
        patch.setattr(torch.distributed, "get_world_size", lambda: 2)
        patch.setattr(torch.distributed, "all_reduce", lambda t, op: reduced.append(t) or t.mul_(2))
        model = bn_net_1d_and_2d()
        af.recompute_bn_stats(model, [torch.randn(4, 3, 6, 6)])
        assert reduced == []
        af.recompute_bn_stats(model, [torch.randn(4, 3, 6, 6)], sync_ranks=True)
        assert len(reduced) == 2 * 2  # mean and variance of both BatchNorms; 2 * sum / 2 ranks: unchanged
        state = types.SimpleNamespace(model=model, timestamp=types.SimpleNamespace(epoch=1),
                                      train_batches=lambda: iter([torch.randn(4, 3, 6, 6)]))
        SWA(swa_start="0ep", swa_end="1ep", update_interval="1ep").apply(Event.EPOCH_END, state)
        assert len(reduced) == 2 * 2 * 2
        before = {name: b.clone() for name, b in model.named_buffers()}
        average_buffers(model)
        floating = [name for name, b in model.named_buffers() if b.is_floating_point()]
        assert len(reduced) == 8 + len(floating)
        assert all(torch.equal(before[name], b) for name, b in model.named_buffers())


# --- event forms --------------------------------------------------------------------------


class Snapshots(Algorithm):
    """Appended last, so at after-events it runs before the real methods: the weights just
    after the optimizer step, before EMA/SWA touch them."""

    events = frozenset({Event.BATCH_END})

    def __init__(self):
        self.seen = []

    def apply(self, event, state):
        self.seen.append({k: v.detach().clone() for k, v in unwrap(state.model).state_dict().items()})


def ema_evaluates_with_the_average_and_trains_on_with_the_training_weights():
    trainer = trainer_for({"name": "ema", "smoothing": 0.6, "ema_start": "2ba"}, max_duration="5ba",
                          eval_samples=32, eval_interval="2ba")  # evaluates at batches 2, 4 and at the end
    snapshots = Snapshots()
    trainer.engine.algorithms.append(snapshots)
    at_eval = []

    class Recorder:
        def run_event(self, event, state):
            if event in (Event.EVAL_START, Event.EVAL_END):
                at_eval.append((event, state.timestamp.batch,
                                {k: v.clone() for k, v in unwrap(state.model).state_dict().items()}))

    trainer.engine.callbacks.append(Recorder())
    trainer.fit()
    # The average starts at batch 2 from that batch's weights, then ema = 0.6 ema + 0.4 w.
    expected, averages = None, {}
    for batch, weights in enumerate(snapshots.seen, start=1):
        if batch >= 2:
            expected = {k: v.clone() for k, v in weights.items()} if expected is None else {
                k: 0.6 * expected[k] + 0.4 * v if v.is_floating_point() else v for k, v in weights.items()}
            averages[batch] = expected
    assert [(e, b) for e, b, _ in at_eval] == [(Event.EVAL_START, 2), (Event.EVAL_END, 2), (Event.EVAL_START, 4),
                                               (Event.EVAL_END, 4), (Event.EVAL_START, 5), (Event.EVAL_END, 5)]
    for event, batch, weights in at_eval:
        want = averages[batch] if event is Event.EVAL_START else snapshots.seen[batch - 1]
        assert all(torch.allclose(weights[k], want[k], atol=1e-6) for k in want), (event, batch)
    final = unwrap(trainer.state.model).state_dict()
    assert all(torch.equal(final[k], snapshots.seen[-1][k]) for k in final)  # training weights, not the average
    held = trainer.state.algorithms[0].state_dict()["averaged"]
    assert all(torch.allclose(held[k], averages[5][k], atol=1e-6) for k in held)


def swa_loads_the_average_at_swa_end_and_recomputes_batchnorm():
    model = {"name": "cifar_resnet20", "params": {"width": 4}}
    trainer = trainer_for({"name": "swa", "swa_start": "0.25dur", "swa_end": "0.75dur", "update_interval": "1ba"},
                          max_duration="8ba", model=model, num_samples=128)  # one epoch of 8 batches
    snapshots = Snapshots()
    trainer.engine.algorithms.append(snapshots)
    inputs, after_end, passed = [], [], []
    fresh_epoch = trainer.state.train_batches

    def recorded_pass():
        for batch in fresh_epoch():
            passed.append(batch[0].clone())
            yield batch

    trainer.state.train_batches = recorded_pass

    class Recorder:
        def run_event(self, event, state):
            if event is Event.AFTER_DATALOADER:
                inputs.append(state.inputs.clone())
            if event is Event.BATCH_END and state.timestamp.batch == 6:
                after_end.append(copy.deepcopy(unwrap(state.model)))

    trainer.engine.callbacks.append(Recorder())
    trainer.fit()
    swa = trainer.state.algorithms[0]
    assert swa.completed and swa.num_averaged == 5  # batches 2..6: progress 0.25 .. 0.75
    (replaced,) = after_end
    params = dict(replaced.named_parameters())
    for name in params:
        mean = torch.stack([snapshots.seen[b - 1][name] for b in range(2, 7)]).mean(0)
        assert torch.allclose(params[name], mean, atol=1e-6), name
    # The BatchNorm pass read the whole epoch (bn_update_batches: None), the batches training
    # saw, and left the loader where it was: batches 7 and 8 were trained on after it.
    assert len(passed) == 8 and len(inputs) == 8
    assert all(torch.equal(p, i) for p, i in zip(passed, inputs))
    # Its statistics are torch.optim.swa_utils.update_bn's on the averaged weights and that data.
    reference = copy.deepcopy(replaced)
    for module in reference.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.fill_(123.0)
    update_bn(passed, reference)
    for (name, got), (_, want) in zip(replaced.named_buffers(), reference.named_buffers()):
        assert torch.allclose(got, want, atol=1e-6), name
    bn_mean = next(k for k in snapshots.seen[5] if k.endswith("running_mean"))
    assert not torch.allclose(replaced.state_dict()[bn_mean], snapshots.seen[5][bn_mean])


PROPERTY_CHECKS = {
    "ema": [ema_follows_the_exact_update_rule_for_parameters_and_buffers,
            ema_smoothing_is_zero_or_one_at_the_extremes_and_half_life_halves],
    "swa": [swa_average_is_the_mean_of_the_snapshots,
            swa_recomputes_batchnorm_statistics_as_the_average_over_the_batches,
            swa_bn_stats_equal_torch_update_bn_on_the_same_loader,
            swa_at_swa_end_passes_over_bn_update_batches_of_the_training_data,
            swa_bn_stats_averaged_over_ranks_are_update_bn_over_all_their_batches,
            swa_recompute_bn_stats_syncs_ranks_only_when_asked],
}

EVENT_CHECKS = {
    "ema": [ema_evaluates_with_the_average_and_trains_on_with_the_training_weights],
    "swa": [swa_loads_the_average_at_swa_end_and_recomputes_batchnorm],
}

FUNCTIONAL_NAMES = {"ema": "compute_ema", "swa": "update_swa"}
