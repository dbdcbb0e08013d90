"""Every method's functional form, checked for its defining properties.

Parametrized from the registry: a method registered without an entry in ``PROPERTY_CHECKS``
fails ``test_functional_form_has_its_properties``.
"""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import algorithms.functional as af
from algorithms.base import NoEffectWarning
from algorithms.registry import ALGORITHM_CLASSES
from tests.algorithms import checks_augmentations as augmentations
from tests.algorithms import checks_block_surgery as block_surgery
from tests.algorithms import checks_optimization as optimization
from tests.algorithms import checks_randaugment as randaugment
from tests.algorithms import checks_weight_averaging as weight_averaging
from tests.algorithms.surgery_checks import SURGERY_FUNCTIONAL_NAMES, SURGERY_PROPERTY_CHECKS

# --- channels_last ------------------------------------------------------------------------


def small_convnet():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2)).eval()


def channels_last_converts_4d_params_and_keeps_outputs():
    model, x = small_convnet(), torch.randn(2, 3, 10, 10)
    expected = model(x)
    params_before = list(model.parameters())
    assert af.apply_channels_last(model) is model
    four_d = [p for p in model.parameters() if p.dim() == 4]
    assert four_d and all(p.is_contiguous(memory_format=torch.channels_last) for p in four_d)
    assert all(a is b for a, b in zip(params_before, model.parameters()))  # same Parameters: optimizers unaffected
    assert torch.allclose(model(x), expected, atol=1e-5)


def channels_last_warns_when_there_is_nothing_to_convert():
    with pytest.warns(NoEffectWarning, match="no 4-d"):
        af.apply_channels_last(torch.nn.Linear(3, 2))


# --- label_smoothing ----------------------------------------------------------------------


def smoothed_index_targets_follow_the_exact_formula():
    logits, target = torch.randn(3, 5), torch.tensor([0, 4, 2])
    smoothed = af.smooth_labels(logits, target, smoothing=0.1)
    expected = torch.full((3, 5), 0.02)
    expected[torch.arange(3), target] = 0.92
    assert torch.allclose(smoothed, expected)
    assert torch.allclose(smoothed.sum(dim=1), torch.ones(3))


def smoothed_dense_targets_stay_distributions():
    logits = torch.randn(4, 3)
    dense = torch.softmax(torch.randn(4, 3), dim=1)
    smoothed = af.smooth_labels(logits, dense, smoothing=0.3)
    assert torch.allclose(smoothed, 0.7 * dense + 0.1)
    assert torch.allclose(smoothed.sum(dim=1), torch.ones(4))
    assert torch.equal(af.smooth_labels(logits, torch.tensor([1, 0, 2, 1]), smoothing=0.0),
                       F.one_hot(torch.tensor([1, 0, 2, 1]), 3).float())


# --- cutmix -------------------------------------------------------------------------------


def cutmix_with_a_given_box_and_permutation_is_deterministic():
    x, y = torch.randn(4, 2, 6, 8), torch.tensor([0, 1, 2, 3])
    indices = torch.tensor([3, 2, 1, 0])
    mixed, permuted, area, bbox = af.cutmix_batch(x, y, bbox=(1, 2, 4, 7), indices=indices)
    assert bbox == (1, 2, 4, 7)
    # As in Composer, x runs along dim -2 (rows) and y along dim -1 (columns).
    assert torch.equal(mixed[:, :, 1:4, 2:7], x[indices, :, 1:4, 2:7])
    outside = torch.ones(6, 8, dtype=torch.bool)
    outside[1:4, 2:7] = False
    assert torch.equal(mixed[:, :, outside], x[:, :, outside])
    assert torch.equal(permuted, y[indices])
    assert area == pytest.approx(1 - 15 / 48)
    again = af.cutmix_batch(x, y, bbox=(1, 2, 4, 7), indices=indices)
    assert torch.equal(again[0], mixed)


def cutmix_target_weights_equal_the_pasted_area_fraction():
    torch.manual_seed(0)
    for uniform_sampling in (False, True):
        for _ in range(20):
            x, y = torch.randn(8, 3, 16, 12), torch.arange(8)
            mixed, permuted, area, (x1, y1, x2, y2) = af.cutmix_batch(x, y, alpha=1.0,
                                                                     uniform_sampling=uniform_sampling)
            assert 0 <= x1 <= x2 <= 16 and 0 <= y1 <= y2 <= 12
            changed = (mixed != x).any(dim=1)  # (N, H, W): pixels that came from another image
            moved = permuted != y  # examples that received a different image
            pasted = changed[moved].float().mean().item() if moved.any() else 1 - area
            assert pasted == pytest.approx(1 - area)
            targets = af.mix_targets(y, permuted, area, num_classes=8)
            assert torch.allclose(targets.sum(dim=1), torch.ones(8))
            rows = torch.arange(8)[moved]
            assert torch.allclose(targets[rows, y[rows]], torch.full((len(rows),), area))
            assert torch.allclose(targets[rows, permuted[rows]], torch.full((len(rows),), 1 - area))


def cutmix_mixes_dense_targets_and_keeps_memory_format():
    x = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    dense = torch.softmax(torch.randn(4, 5), dim=1)
    mixed, permuted, area, _ = af.cutmix_batch(x, dense, length=0.5)
    assert mixed.is_contiguous(memory_format=torch.channels_last)
    targets = af.mix_targets(dense, permuted, area, num_classes=5)
    assert torch.allclose(targets, area * dense + (1 - area) * permuted)
    with pytest.raises(ValueError, match="not both"):
        af.cutmix_batch(x, dense, length=0.5, bbox=(0, 0, 2, 2))


def cutmix_with_length_cuts_a_box_of_that_side():
    torch.manual_seed(1)
    areas = [af.cutmix_batch(torch.randn(2, 1, 20, 20), torch.arange(2), length=0.5)[2] for _ in range(200)]
    assert min(areas) == pytest.approx(1 - 100 / 400)  # an unclipped 10x10 box
    assert max(areas) <= 1.0


PROPERTY_CHECKS = {
    "channels_last": [channels_last_converts_4d_params_and_keeps_outputs,
                      channels_last_warns_when_there_is_nothing_to_convert],
    "label_smoothing": [smoothed_index_targets_follow_the_exact_formula,
                        smoothed_dense_targets_stay_distributions],
    "cutmix": [cutmix_with_a_given_box_and_permutation_is_deterministic,
               cutmix_target_weights_equal_the_pasted_area_fraction,
               cutmix_mixes_dense_targets_and_keeps_memory_format,
               cutmix_with_length_cuts_a_box_of_that_side],
    **SURGERY_PROPERTY_CHECKS,
    **augmentations.PROPERTY_CHECKS,
    **weight_averaging.PROPERTY_CHECKS,
    **optimization.PROPERTY_CHECKS,
    **block_surgery.BLOCK_SURGERY_PROPERTY_CHECKS,
    **randaugment.PROPERTY_CHECKS,
}

FUNCTIONAL_NAMES = {"channels_last": "apply_channels_last", "label_smoothing": "smooth_labels",
                    "cutmix": "cutmix_batch", **SURGERY_FUNCTIONAL_NAMES,
                    **augmentations.FUNCTIONAL_NAMES, **weight_averaging.FUNCTIONAL_NAMES,
                    **optimization.FUNCTIONAL_NAMES, **block_surgery.BLOCK_SURGERY_FUNCTIONAL_NAMES,
                    **randaugment.FUNCTIONAL_NAMES}


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_functional_form_has_its_properties(name):
    checks = PROPERTY_CHECKS.get(name)
    assert checks, f"{name} has no functional property checks; add them to PROPERTY_CHECKS"
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)  # only checks that expect it may warn
        for check in checks:
            check()


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_functional_form_is_exported_from_algorithms_functional(name):
    assert name in FUNCTIONAL_NAMES, f"name {name}'s functional form in FUNCTIONAL_NAMES"
    assert FUNCTIONAL_NAMES[name] in af.__all__ and callable(getattr(af, FUNCTIONAL_NAMES[name]))


def test_functional_forms_do_not_modify_their_inputs():
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 3])
    x_before, y_before = x.clone(), y.clone()
    af.cutmix_batch(x, y, alpha=1.0)
    af.smooth_labels(torch.randn(4, 4), y)
    assert torch.equal(x, x_before) and torch.equal(y, y_before)
    model = small_convnet()
    snapshot = copy.deepcopy(model.state_dict())
    af.apply_channels_last(model)
    assert all(torch.equal(snapshot[k], v) for k, v in model.state_dict().items())
