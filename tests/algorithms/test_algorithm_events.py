"""Every method's Algorithm form, checked inside short real training runs.

Parametrized from the registry: a method registered without an entry in ``EVENT_CHECKS``
fails ``test_algorithm_does_its_work_at_its_events_in_a_training_run``.
"""

import pytest
import torch

from algorithms.base import Algorithm
from algorithms.events import Event
from algorithms.functional import smooth_labels
from algorithms.registry import ALGORITHM_CLASSES, build_algorithm
from api.algorithm_specs import ALGORITHM_SPECS
from api.catalog import ALGORITHMS
from api.method_cards import CARDS, card_file_name
from api.specs import RunSpec
from tests.algorithms.surgery_event_checks import SURGERY_EVENT_CHECKS
from tests.algorithms import checks_augmentations as augmentations
from tests.algorithms import checks_block_surgery as block_surgery
from tests.algorithms import checks_optimization as optimization
from tests.algorithms import checks_randaugment as randaugment
from tests.algorithms import checks_weight_averaging as weight_averaging
from workers.parallel import unwrap
from workers.trainer import Trainer

NUM_CLASSES = 4


def short_run(*algorithm_specs, max_duration="3ba") -> Trainer:
    """A Trainer (not yet fitted) on 8x8 synthetic images with a narrow simple_cnn."""
    return Trainer(RunSpec.model_validate({
        "name": "events",
        "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
        "data": {"train": {"name": "synthetic", "num_samples": 64, "image_size": 8, "num_classes": NUM_CLASSES},
                 "batch_size": 16},
        "optimizer": {"name": "sgd", "lr": 0.05},
        "max_duration": max_duration,
        "algorithms": list(algorithm_specs),
    }))


class Watch:
    """A callback (runs after all algorithms) keeping a copy of some state at chosen events."""

    def __init__(self, *events, read):
        self.watched, self.read, self.seen = set(events), read, []

    def run_event(self, event, state):
        if event in self.watched:
            self.seen.append((event, self.read(state)))


class Probe(Algorithm):
    """An algorithm appended last: at after-events it runs *first*, before the real methods."""

    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self):
        self.seen = []

    def apply(self, event, state):
        self.seen.append((state.inputs.clone(), state.targets.clone()))


def fit_with(trainer, *watchers, probe=None):
    trainer.engine.callbacks.extend(watchers)
    if probe is not None:
        trainer.engine.algorithms.append(probe)
    return trainer.fit()


# --- per-method checks --------------------------------------------------------------------


def channels_last_converts_the_model_before_training_and_every_input_batch():
    trainer = short_run({"name": "channels_last"})
    four_d = [p for p in unwrap(trainer.state.model).parameters() if p.dim() == 4]
    assert four_d and all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)
    inputs = Watch(Event.BEFORE_FORWARD, read=lambda s: s.inputs.is_contiguous(memory_format=torch.channels_last))
    fit_with(trainer, inputs)
    assert [flag for _, flag in inputs.seen] == [True] * 3


def label_smoothing_smooths_targets_for_the_loss_and_restores_them_after():
    trainer = short_run({"name": "label_smoothing", "smoothing": 0.2})
    targets = Watch(Event.BEFORE_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
                    read=lambda s: (s.targets, s.outputs))
    fit_with(trainer, targets)
    for step in range(3):
        (_, (original, _)), (_, (smoothed, outputs)), (_, (restored, _)) = targets.seen[3 * step:3 * step + 3]
        assert original.dtype == torch.int64
        assert torch.allclose(smoothed, smooth_labels(outputs, original, 0.2))
        assert restored is original


def cutmix_mixes_inputs_and_targets_by_the_pasted_area():
    trainer = short_run({"name": "cutmix", "alpha": 1.0})
    after = Watch(Event.AFTER_DATALOADER, read=lambda s: (s.inputs.clone(), s.targets.clone()))
    probe = Probe()
    fit_with(trainer, after, probe=probe)
    for (x, y), (_, (mixed, targets)) in zip(probe.seen, after.seen):
        assert y.dtype == torch.int64 and targets.shape == (16, NUM_CLASSES)
        assert torch.allclose(targets.sum(dim=1), torch.ones(16))
        changed = (mixed != x).any(dim=1)  # (N, H, W): pixels pasted from another image
        keep = 1.0 - changed.any(dim=0).float().mean().item()  # one box for the whole batch
        # Each row is keep * its own label + (1 - keep) * one other example's label.
        rest = targets - keep * torch.nn.functional.one_hot(y, NUM_CLASSES).float()
        assert torch.allclose(rest.sum(dim=1), torch.full((16,), 1.0 - keep), atol=1e-6)
        assert torch.allclose(rest.max(dim=1).values, torch.full((16,), 1.0 - keep), atol=1e-6)


def cutmix_and_label_smoothing_compose_on_dense_targets():
    trainer = short_run({"name": "cutmix"}, {"name": "label_smoothing", "smoothing": 0.1})
    loss_targets = Watch(Event.BEFORE_LOSS, read=lambda s: s.targets.clone())
    final = fit_with(trainer, loss_targets)
    for _, targets in loss_targets.seen:
        assert torch.allclose(targets.sum(dim=1), torch.ones(16))
        assert targets.min() >= 0.1 / NUM_CLASSES - 1e-6
    assert torch.isfinite(torch.tensor(final["train/loss"]))


EVENT_CHECKS = {
    "channels_last": [channels_last_converts_the_model_before_training_and_every_input_batch],
    "label_smoothing": [label_smoothing_smooths_targets_for_the_loss_and_restores_them_after,
                        cutmix_and_label_smoothing_compose_on_dense_targets],
    "cutmix": [cutmix_mixes_inputs_and_targets_by_the_pasted_area],
    **SURGERY_EVENT_CHECKS,
    **augmentations.EVENT_CHECKS,
    **weight_averaging.EVENT_CHECKS,
    **optimization.EVENT_CHECKS,
    **block_surgery.BLOCK_SURGERY_EVENT_CHECKS,
    **randaugment.EVENT_CHECKS,
}


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_algorithm_does_its_work_at_its_events_in_a_training_run(name):
    checks = EVENT_CHECKS.get(name)
    assert checks, f"{name} has no event-form checks; add them to EVENT_CHECKS"
    for check in checks:
        check()


# --- contracts every method keeps ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_algorithm_is_built_from_its_default_spec(name):
    algorithm = build_algorithm(ALGORITHM_SPECS[name](name=name))
    assert type(algorithm) is ALGORITHM_CLASSES[name] and algorithm.name == name
    assert algorithm.events and algorithm.events <= set(Event)
    assert (Event.INIT in algorithm.events) == algorithm.changes_model


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_match_never_changes_the_state_or_the_algorithm(name):
    trainer = short_run()
    state = trainer.state
    state.inputs, state.targets = next(iter(trainer.train_loader))
    state.outputs = state.model(state.inputs)
    algorithm = build_algorithm(ALGORITHM_SPECS[name](name=name))
    before_fields = dict(vars(state))
    before_tensors = {k: v.clone() for k, v in before_fields.items() if isinstance(v, torch.Tensor)}
    before_params = [p.clone() for p in state.model.parameters()]
    before_algorithm = dict(vars(algorithm))
    matched = {event for event in Event if algorithm.match(event, state)}
    assert matched == set(algorithm.events)
    assert vars(state) == before_fields and vars(algorithm) == before_algorithm
    assert all(torch.equal(before_tensors[k], getattr(state, k)) for k in before_tensors)
    assert all(torch.equal(a, b) for a, b in zip(before_params, state.model.parameters()))


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_method_card_covers_use_hyperparameters_caveats_and_attribution(name):
    card = CARDS.joinpath(card_file_name(name))
    assert card.is_file(), f"api/method_cards/{card_file_name(name)} is missing"
    text = card.read_text()
    for section in ("## What it does", "## When it helps", "## Hyperparameters", "## Caveats", "## Attribution"):
        assert section in text, f"{card} lacks {section!r}"
    assert f"maturity: **{ALGORITHMS[name].maturity}**" in text
