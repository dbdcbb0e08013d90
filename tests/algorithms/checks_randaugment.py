"""Functional and event-form checks of RandAugment; merged into the registry-parametrized tables."""

import torch

import algorithms.functional as af
from algorithms.augmix import augmentation_sets
from algorithms.events import Event


def randaugment_applies_depth_operations_drawn_from_the_set():
    calls = []

    def record(name):
        def op(image, severity):
            calls.append((name, severity))
            return image + 1
        return op
    x = torch.zeros(3, 8, 8)
    out = af.randaugment_image(x, severity=7, depth=3, augmentation_set=[record("a"), record("b")])
    assert torch.equal(out, x + 3) and len(calls) == 3 and {s for _, s in calls} == {7}
    torch.manual_seed(0)
    calls.clear()
    for _ in range(100):
        af.randaugment_image(x, depth=1, augmentation_set=[record("a"), record("b")])
    assert 30 < sum(n == "a" for n, _ in calls) < 70  # drawn uniformly
    batch = torch.rand(4, 3, 8, 8)
    for ops in augmentation_sets.values():
        out = af.randaugment_image(batch, severity=9, depth=2, augmentation_set=ops)
        assert out.shape == batch.shape and out.dtype == batch.dtype and 0 <= out.min() and out.max() <= 1
    as_bytes = (batch[0] * 255).to(torch.uint8)
    assert af.randaugment_image(as_bytes).dtype == torch.uint8


def randaugment_installs_its_transform_and_augments_every_training_example():
    from tests.algorithms.test_algorithm_events import Watch, fit_with, short_run
    trainer = short_run({"name": "randaugment", "severity": 9, "depth": 2})
    seen = Watch(Event.AFTER_DATALOADER, read=lambda s: s.inputs.clone())
    fit_with(trainer, seen)
    loader = trainer.train_loader
    assert len(loader.sample_transforms) == 1
    loader.set_epoch(0)
    transforms, loader.sample_transforms = loader.sample_transforms, []
    clean = next(iter(loader))[0]
    loader.sample_transforms = transforms
    augmented = seen.seen[0][1]
    assert augmented.shape == clean.shape and augmented.dtype == clean.dtype
    assert not torch.allclose(augmented, clean)


PROPERTY_CHECKS = {"randaugment": [randaugment_applies_depth_operations_drawn_from_the_set]}
EVENT_CHECKS = {"randaugment": [randaugment_installs_its_transform_and_augments_every_training_example]}
FUNCTIONAL_NAMES = {"randaugment": "randaugment_image"}
