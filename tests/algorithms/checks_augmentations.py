"""Functional and event-form checks of the data-augmentation methods (MixUp, CutOut, ColOut,
AugMix, ProgressiveResizing); ``test_functional_forms`` and ``test_algorithm_events`` merge
these dicts into their registry-parametrized tables."""

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T

import algorithms.functional as af
from algorithms.augmix import AugmentAndMixTransform, augmentation_sets
from algorithms.base import Algorithm
from algorithms.colout import ColOutTransform
from algorithms.cutout import cutout_boxes
from algorithms.events import Event
from algorithms.progressive_resizing import ProgressiveResizing, scale_at

# --- mixup --------------------------------------------------------------------------------


def mixup_output_is_the_convex_combination_with_the_returned_mixing():
    torch.manual_seed(0)
    x, y = torch.randn(8, 3, 5, 5), torch.arange(8) % 4
    indices = torch.randperm(8)
    mixed, permuted, mixing = af.mixup_batch(x, y, alpha=0.2, indices=indices)
    assert 0.0 <= mixing <= 0.5  # min(z, 1 - z): the original example dominates
    assert torch.allclose(mixed, (1 - mixing) * x + mixing * x[indices], atol=1e-6)
    assert torch.equal(permuted, y[indices])
    targets = af.mixup_targets(y, permuted, mixing, num_classes=4)
    expected = (1 - mixing) * F.one_hot(y, 4).float() + mixing * F.one_hot(y[indices], 4).float()
    assert torch.allclose(targets, expected, atol=1e-6) and torch.allclose(targets.sum(1), torch.ones(8))
    fixed, _, given = af.mixup_batch(x, y, mixing=0.3, indices=indices)
    assert given == 0.3 and torch.allclose(fixed, 0.7 * x + 0.3 * x[indices], atol=1e-6)


def mixup_weights_follow_the_folded_beta_distribution():
    torch.manual_seed(1)
    draws = torch.tensor([af.mixup_batch(torch.zeros(2, 1), torch.zeros(2), alpha=1.0)[2] for _ in range(4000)])
    # alpha = 1: z is uniform, so min(z, 1 - z) is uniform on [0, 0.5] with mean 0.25.
    assert draws.min() >= 0 and draws.max() <= 0.5
    assert draws.mean().item() == pytest.approx(0.25, abs=0.01)


def mixup_permutes_dense_targets_so_it_composes_with_cutmix():
    x, dense = torch.randn(4, 3, 8, 8), torch.softmax(torch.randn(4, 5), dim=1)
    indices = torch.tensor([2, 3, 0, 1])
    _, permuted, mixing = af.mixup_batch(x, dense, mixing=0.25, indices=indices)
    assert torch.equal(permuted, dense[indices])
    targets = af.mixup_targets(dense, permuted, mixing, num_classes=5)
    assert torch.allclose(targets, 0.75 * dense + 0.25 * dense[indices])
    cut, cut_perm, area, _ = af.cutmix_batch(x, targets, bbox=(0, 0, 4, 4), indices=indices)
    assert torch.allclose(af.mix_targets(targets, cut_perm, area, 5).sum(1), torch.ones(4))


# --- cutout -------------------------------------------------------------------------------


def cutout_zeroes_exactly_the_holes_and_nothing_else():
    for uniform_sampling in (False, True):
        for seed in range(30):
            x = torch.rand(4, 3, 12, 10) + 0.5  # no zeros before cutting
            torch.manual_seed(seed)
            boxes = cutout_boxes(12, 10, num_holes=2, length=0.5, uniform_sampling=uniform_sampling)
            torch.manual_seed(seed)
            out = af.cutout_batch(x, num_holes=2, length=0.5, uniform_sampling=uniform_sampling)
            holes = torch.zeros(12, 10, dtype=torch.bool)
            for top, left, bottom, right in boxes:
                assert 0 <= top <= bottom <= 12 and 0 <= left <= right <= 10
                assert bottom - top <= 5 and right - left <= 5  # side int(0.5 * min(12, 10))
                holes[top:bottom, left:right] = True
            assert torch.equal(out == 0, holes.expand_as(out))  # same holes in every image and channel
            assert torch.equal(out[..., ~holes], x[..., ~holes])


def cutout_cuts_a_full_square_away_from_the_borders():
    torch.manual_seed(3)
    sides = []
    for _ in range(200):
        out = af.cutout_batch(torch.ones(1, 1, 20, 20), length=0.4)
        zero_rows = (out[0, 0] == 0).any(1).sum().item()
        zero_cols = (out[0, 0] == 0).any(0).sum().item()
        sides.append((zero_rows, zero_cols))
    assert max(sides) == (8, 8)  # an unclipped hole is int(0.4 * 20) pixels square


def cutout_keeps_the_memory_format_and_leaves_its_input_alone():
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    before = x.clone()
    out = af.cutout_batch(x)
    assert out.is_contiguous(memory_format=torch.channels_last) and torch.equal(x, before)


# --- colout -------------------------------------------------------------------------------


def coded_images(n=3, c=2, h=10, w=12):
    """Pixel (i, j) of every image holds 100 * i + j, so the output names the rows/cols kept."""
    code = (100 * torch.arange(h).view(h, 1) + torch.arange(w).view(1, w)).float()
    return code.expand(n, c, h, w).clone()


def colout_drops_the_same_rows_and_columns_from_the_whole_batch():
    torch.manual_seed(0)
    for p_row, p_col in ((0.15, 0.15), (0.5, 0.0), (0.0, 0.3)):
        x = coded_images()
        out = af.colout_batch(x, p_row=p_row, p_col=p_col)
        assert out.shape == (3, 2, int((1 - p_row) * 10), int((1 - p_col) * 12))
        rows, cols = (out[0, 0, :, 0] // 100).long(), (out[0, 0, 0, :] % 100).long()
        assert torch.all(rows[1:] > rows[:-1]) and torch.all(cols[1:] > cols[:-1])  # order kept
        assert torch.equal(out, x[..., rows, :][..., cols])  # exactly those rows/cols, all images
        dropped = set(range(10)) - set(rows.tolist())
        assert len(dropped) == 10 - int((1 - p_row) * 10)


def colout_drops_the_same_pixels_from_spatial_targets():
    x, mask = coded_images(), coded_images()[:, 0].long()  # (N, H, W) segmentation-like targets
    out, out_mask = af.colout_batch((x, mask), p_row=0.2, p_col=0.2)
    assert out_mask.shape == out.shape[:1] + out.shape[2:] and torch.equal(out_mask, out[:, 0].long())
    labels = torch.arange(3)
    only = af.colout_batch((x, labels), p_row=0.2, p_col=0.2)  # "auto": class labels are not resized
    assert isinstance(only, torch.Tensor) and only.shape == (3, 2, 8, 9)


def colout_transform_works_per_example_in_torchvision_compose():
    torch.manual_seed(1)
    pipeline = T.Compose([ColOutTransform(p_row=0.3, p_col=0.25)])
    outs = [pipeline(coded_images(1)[0]) for _ in range(20)]
    assert all(o.shape == (2, 7, 9) for o in outs)
    assert len({tuple((o[0, :, 0] // 100).tolist()) for o in outs}) > 1  # each call draws its own rows


# --- augmix -------------------------------------------------------------------------------


def invert(image, severity):
    return 1.0 - image


def augmix_output_is_a_convex_mix_of_the_image_and_its_augmentations():
    torch.manual_seed(0)
    for _ in range(10):
        x = torch.rand(3, 8, 8) * 0.4  # away from 0.5, where inverting changes nothing
        out = af.augmix_image(x, severity=3, depth=1, width=3, alpha=1.0, augmentation_set=[invert])
        # All chains are the same inversion, so out = (1 - m) x + m (1 - x) for one m in [0, 1].
        mixing = (out - x) / (1 - 2 * x)
        assert out.shape == x.shape and out.dtype == x.dtype
        assert torch.allclose(mixing, mixing.flatten()[0].expand_as(mixing), atol=1e-5)
        assert 0.0 <= mixing.flatten()[0].item() <= 1.0


def augmix_keeps_shape_dtype_and_range_for_every_augmentation_set():
    torch.manual_seed(2)
    x = torch.rand(3, 16, 16)
    for name, ops in augmentation_sets.items():
        for op in ops:
            y = op(x, 3)
            assert y.shape == x.shape and y.dtype == x.dtype, (name, op.__name__)
        out = af.augmix_image(x, augmentation_set=ops)
        assert out.shape == x.shape and out.dtype == x.dtype and out.min() >= -1e-6 and out.max() <= 1 + 1e-6
    as_bytes = (x * 255).to(torch.uint8)
    assert af.augmix_image(as_bytes).dtype == torch.uint8
    assert T.Compose([AugmentAndMixTransform(severity=2)])(x).shape == x.shape


# --- progressive_resizing -----------------------------------------------------------------


def progressive_resizing_schedule_has_composer_values_at_given_progress():
    for progress, expected in ((0.0, 0.5), (0.3, 0.5), (0.5, 0.5), (0.575, 0.625), (0.65, 0.75), (0.8, 1.0),
                               (1.0, 1.0)):
        assert scale_at(progress, initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2) == \
            pytest.approx(expected)
    algorithm = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.5, finetune_fraction=0.2, size_increment=4)
    # 32 px wide: 0.625 * 32 = 20 px is a multiple of 4; 0.55 * 32 = 17.6 px rounds to 16.
    assert algorithm.scale_for(0.575, 32) == pytest.approx(20 / 32)
    assert algorithm.scale_for(0.53, 32) == pytest.approx(16 / 32)
    assert algorithm.scale_for(0.0, 8) == pytest.approx(4 / 8)


def resize_batch_matches_nearest_interpolation_and_crops_a_window():
    x = torch.randn(2, 3, 24, 20)
    for scale in (0.25, 0.5, 0.6, 0.75, 1 / 3):
        resized, y = af.resize_batch(x, torch.arange(2), scale)
        assert torch.equal(resized, F.interpolate(x, scale_factor=scale, mode="nearest",
                                                  recompute_scale_factor=False))
        assert torch.equal(y, torch.arange(2))
    mask = torch.randint(0, 5, (2, 24, 20))
    _, small_mask = af.resize_batch(x, mask, 0.5, resize_targets=True)
    assert torch.equal(small_mask, mask[:, ::2, ::2])
    torch.manual_seed(0)
    cropped, _ = af.resize_batch(x, torch.arange(2), 0.5, mode="crop")
    assert cropped.shape == (2, 3, 12, 10)
    windows = [x[..., t:t + 12, l:l + 10] for t in range(13) for l in range(11)]
    assert any(torch.equal(cropped, w) for w in windows)
    assert af.resize_batch(x, mask, 1.0)[0] is x


# --- event forms --------------------------------------------------------------------------


def trainer_for(*algorithm_specs, max_duration="3ba", num_samples=64, image_size=8, model=None, eval_samples=0,
                eval_interval=None, batch_size=16):
    """A Trainer (not fitted) on synthetic images; ``model`` defaults to a narrow simple_cnn."""
    from api.specs import RunSpec
    from workers.trainer import Trainer
    data = {"train": {"name": "synthetic", "num_samples": num_samples, "image_size": image_size, "num_classes": 4},
            "batch_size": batch_size}
    if eval_samples:
        data["eval"] = {"name": "synthetic", "split": "test", "num_samples": eval_samples,
                        "image_size": image_size, "num_classes": 4}
    return Trainer(RunSpec.model_validate({
        "name": "checks", "model": model or {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
        "data": data, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "max_duration": max_duration, "eval_interval": eval_interval, "algorithms": list(algorithm_specs),
        "seed": 3,
    }))


class RngProbe(Algorithm):
    """Appended last: at after-events it runs first, so it sees the batch and the random state
    the real methods are about to use."""

    events = frozenset({Event.AFTER_DATALOADER})

    def __init__(self):
        self.seen = []

    def apply(self, event, state):
        self.seen.append((state.inputs.clone(), state.targets.clone(), torch.get_rng_state()))


def replayed(probe, after, fn):
    """For each batch, ``fn(x, y)`` re-run with the random state the algorithm saw, next to what
    the algorithm actually produced."""
    for (x, y, rng), (_, produced) in zip(probe.seen, after.seen, strict=True):
        torch.set_rng_state(rng)
        yield fn(x, y), produced


def mixup_mixes_inputs_and_targets_with_one_weight_per_batch():
    from tests.algorithms.test_algorithm_events import NUM_CLASSES, Watch, fit_with, short_run

    def expected(x, y):
        mixed, permuted, mixing = af.mixup_batch(x, y, alpha=0.4)
        return mixed, af.mixup_targets(y, permuted, mixing, NUM_CLASSES)

    trainer = short_run({"name": "mixup", "alpha": 0.4})
    after = Watch(Event.AFTER_DATALOADER, read=lambda s: (s.inputs.clone(), s.targets.clone()))
    probe = RngProbe()
    fit_with(trainer, after, probe=probe)
    assert len(after.seen) == 3
    for (mixed, mixed_targets), (inputs, targets) in replayed(probe, after, expected):
        assert torch.equal(inputs, mixed) and torch.equal(targets, mixed_targets)
        assert targets.shape == (16, NUM_CLASSES) and torch.allclose(targets.sum(1), torch.ones(16))
        assert targets.max(1).values.min() >= 0.5 - 1e-6  # each row is mostly its own label


def mixup_cutmix_and_label_smoothing_compose_on_dense_targets():
    from tests.algorithms.test_algorithm_events import NUM_CLASSES, Watch, fit_with, short_run
    trainer = short_run({"name": "mixup"}, {"name": "cutmix"}, {"name": "label_smoothing", "smoothing": 0.1})
    loss_targets = Watch(Event.BEFORE_LOSS, read=lambda s: s.targets.clone())
    final = fit_with(trainer, loss_targets)
    assert len(loss_targets.seen) == 3
    for _, targets in loss_targets.seen:
        assert torch.allclose(targets.sum(dim=1), torch.ones(16))
        assert targets.min() >= 0.1 / NUM_CLASSES - 1e-6
    assert torch.isfinite(torch.tensor(final["train/loss"]))


def cutout_zeroes_the_same_holes_the_functional_form_cuts():
    from tests.algorithms.test_algorithm_events import Watch, fit_with, short_run
    trainer = short_run({"name": "cutout", "num_holes": 2, "length": 0.25})
    after = Watch(Event.AFTER_DATALOADER, read=lambda s: (s.inputs.clone(), s.targets.clone()))
    probe = RngProbe()
    fit_with(trainer, after, probe=probe)
    for (cut, y), (inputs, targets) in replayed(probe, after, lambda x, y: (af.cutout_batch(x, 2, 0.25), y)):
        assert torch.equal(inputs, cut) and torch.equal(targets, y)
        assert (inputs == 0).any()


def colout_batch_mode_shrinks_every_batch_on_the_device():
    from tests.algorithms.test_algorithm_events import Watch, fit_with, short_run
    trainer = short_run({"name": "colout", "p_row": 0.25, "p_col": 0.5})
    after = Watch(Event.AFTER_DATALOADER, read=lambda s: (s.inputs.clone(), s.targets.clone()))
    shapes = Watch(Event.BEFORE_FORWARD, read=lambda s: tuple(s.inputs.shape))
    probe = RngProbe()
    fit_with(trainer, after, shapes, probe=probe)
    assert [shape for _, shape in shapes.seen] == [(16, 3, 6, 4)] * 3
    for (out, y), (inputs, targets) in replayed(probe, after, lambda x, y: (af.colout_batch(x, 0.25, 0.5), y)):
        assert torch.equal(inputs, out) and torch.equal(targets, y)


def colout_sample_mode_installs_a_per_example_transform_at_fit_start():
    from tests.algorithms.test_algorithm_events import Watch, fit_with, short_run
    trainer = short_run({"name": "colout", "p_row": 0.25, "p_col": 0.25, "batch": False})
    assert trainer.train_loader.sample_transforms == []
    shapes = Watch(Event.AFTER_DATALOADER, read=lambda s: tuple(s.inputs.shape))
    fit_with(trainer, shapes)
    transforms = trainer.train_loader.sample_transforms
    assert len(transforms) == 1 and isinstance(transforms[0], ColOutTransform)
    assert [shape for _, shape in shapes.seen] == [(16, 3, 6, 6)] * 3


def augmix_installs_its_transform_and_augments_every_training_example():
    from tests.algorithms.test_algorithm_events import Watch, fit_with, short_run
    trainer = short_run({"name": "augmix", "severity": 3, "width": 2})
    seen = Watch(Event.AFTER_DATALOADER, read=lambda s: s.inputs.clone())
    fit_with(trainer, seen)
    loader = trainer.train_loader
    assert len(loader.sample_transforms) == 1
    # Replay the loader's first batch without the transform: AugMix changed the examples but
    # kept their shape and dtype.
    loader.set_epoch(0)
    transforms, loader.sample_transforms = loader.sample_transforms, []
    clean = next(iter(loader))[0]
    loader.sample_transforms = transforms
    augmented = seen.seen[0][1]
    assert augmented.shape == clean.shape and augmented.dtype == clean.dtype
    assert not torch.allclose(augmented, clean)


def progressive_resizing_advances_every_batch_within_an_epoch():
    trainer = trainer_for({"name": "progressive_resizing", "initial_scale": 0.5, "delay_fraction": 0.2,
                         "finetune_fraction": 0.2, "size_increment": 2}, max_duration="1ep",
                        num_samples=160, image_size=16)
    sizes = []
    trainer.engine.callbacks.append(type("Sizes", (), {"run_event": lambda self, e, s: sizes.append(
        (s.timestamp.batch, s.inputs.shape[-1])) if e is Event.BEFORE_FORWARD else None})())
    trainer.fit()
    algorithm = trainer.state.algorithms[0]
    # One epoch of 10 batches: the scale must move inside it (Composer's stays at 0.5 with "Nep").
    expected = [round(16 * algorithm.scale_for(batch / 10, 16)) for batch in range(10)]
    assert [size for _, size in sizes] == expected
    assert expected[0] == 8 and expected[-1] == 16 and len(set(expected)) > 3


PROPERTY_CHECKS = {
    "mixup": [mixup_output_is_the_convex_combination_with_the_returned_mixing,
              mixup_weights_follow_the_folded_beta_distribution,
              mixup_permutes_dense_targets_so_it_composes_with_cutmix],
    "cutout": [cutout_zeroes_exactly_the_holes_and_nothing_else,
               cutout_cuts_a_full_square_away_from_the_borders,
               cutout_keeps_the_memory_format_and_leaves_its_input_alone],
    "colout": [colout_drops_the_same_rows_and_columns_from_the_whole_batch,
               colout_drops_the_same_pixels_from_spatial_targets,
               colout_transform_works_per_example_in_torchvision_compose],
    "augmix": [augmix_output_is_a_convex_mix_of_the_image_and_its_augmentations,
               augmix_keeps_shape_dtype_and_range_for_every_augmentation_set],
    "progressive_resizing": [progressive_resizing_schedule_has_composer_values_at_given_progress,
                             resize_batch_matches_nearest_interpolation_and_crops_a_window],
}

EVENT_CHECKS = {
    "mixup": [mixup_mixes_inputs_and_targets_with_one_weight_per_batch,
              mixup_cutmix_and_label_smoothing_compose_on_dense_targets],
    "cutout": [cutout_zeroes_the_same_holes_the_functional_form_cuts],
    "colout": [colout_batch_mode_shrinks_every_batch_on_the_device,
               colout_sample_mode_installs_a_per_example_transform_at_fit_start],
    "augmix": [augmix_installs_its_transform_and_augments_every_training_example],
    "progressive_resizing": [progressive_resizing_advances_every_batch_within_an_epoch],
}

FUNCTIONAL_NAMES = {"mixup": "mixup_batch", "cutout": "cutout_batch", "colout": "colout_batch",
                    "augmix": "augmix_image", "progressive_resizing": "resize_batch"}
