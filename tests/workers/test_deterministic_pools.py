"""DeterministicAdaptiveAvgPool2d computes what nn.AdaptiveAvgPool2d does (forward and backward),
and deterministic_pools swaps it into a model without changing its checkpoints. Whether its
CUDA backward passes under torch.use_deterministic_algorithms is checked on a GPU by
deploy/gpu_check.py (dcp_resume, deterministic_pools)."""

import copy

import pytest
import torch
import torch.nn as nn
import torchvision

from workers.deterministic import DeterministicAdaptiveAvgPool2d, averaging_matrix, deterministic_pools


@pytest.mark.parametrize("shape, output_size", [
    ((2, 3, 8, 8), 4),            # equal bins: avg_pool2d
    ((2, 3, 7, 7), 1),            # global average
    ((2, 3, 7, 7), 3),            # overlapping bins of two widths: averaging matrices
    ((2, 3, 10, 6), (4, None)),   # None keeps that side
    ((1, 2, 5, 9), (2, 4)),
])
def test_same_averages_and_gradients_as_adaptive_avg_pool(shape, output_size):
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    expected = nn.AdaptiveAvgPool2d(output_size)(x)
    got = DeterministicAdaptiveAvgPool2d(output_size)(x2)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (got * weights).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_are_averaged_as_accurately_as_by_the_pool(dtype):
    x = torch.randn(4, 8, 7, 7, dtype=torch.float64)
    exact = nn.AdaptiveAvgPool2d(3)(x)
    plain = nn.AdaptiveAvgPool2d(3)(x.to(dtype)).double()
    got = DeterministicAdaptiveAvgPool2d([3, 3])(x.to(dtype))  # a list, as nn.AdaptiveAvgPool2d takes
    assert got.dtype == dtype
    # Summed in fp32 and rounded once: no further from the exact averages than the pool's own.
    assert (got.double() - exact).abs().max() <= (plain - exact).abs().max() * 1.01 + 1e-6


def test_averaging_matrix_rows_are_pytorchs_bins():
    # 7 -> 3: bins [0, 3), [2, 5), [4, 7) (floor(i*7/3) to ceil((i+1)*7/3))
    matrix = averaging_matrix(7, 3, torch.float64, torch.device("cpu"))
    expected = torch.zeros(3, 7, dtype=torch.float64)
    for row, (start, end) in enumerate([(0, 3), (2, 5), (4, 7)]):
        expected[row, start:end] = 1 / (end - start)
    torch.testing.assert_close(matrix, expected)


def test_swaps_every_adaptive_pool_and_keeps_the_state_dict():
    model = nn.Sequential(torchvision.models.resnet18(num_classes=10),
                          nn.Sequential(nn.Unflatten(1, (10, 1, 1)), nn.AdaptiveAvgPool2d((1, 1))))
    plain = copy.deepcopy(model).eval()
    keys = list(model.state_dict())
    assert deterministic_pools(model) == 2
    assert not any(type(m) is nn.AdaptiveAvgPool2d for m in model.modules())
    assert list(model.state_dict()) == keys
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model.eval()(x), plain(x))
    assert deterministic_pools(model) == 0  # types match exactly: a second pass swaps nothing
