"""What ``deterministic: true`` changes in a model on a CUDA device.

``torch.use_deterministic_algorithms(True)`` makes PyTorch refuse any CUDA kernel that has no
deterministic version, at the first step. ``AdaptiveAvgPool2d``'s backward pass is one of them
(it adds gradients with atomics), and the average pool before the classifier of most image
models (torchvision's ResNets, squeeze-excite blocks) is an ``AdaptiveAvgPool2d``: a
deterministic ResNet on a GPU would fail at once. ``deterministic_pools`` swaps each for
``DeterministicAdaptiveAvgPool2d``, which computes the same averages with kernels whose
backward passes are deterministic. Other operations without a deterministic CUDA kernel still
fail the run with PyTorch's error, which names them.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.surgery import replace_modules


class DeterministicAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` with a deterministic backward pass on CUDA.

    Where each input side is a multiple of the output side, the bins are equal and disjoint:
    ``avg_pool2d`` with kernel = stride = input // output gives the same averages. Otherwise
    (overlapping bins of two widths) it multiplies by one averaging matrix per side: row ``i``
    holds ``1/len`` over bin ``i``, the bins PyTorch uses (``floor(i*n/out)`` to
    ``ceil((i+1)*n/out)``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        size = self.output_size if isinstance(self.output_size, tuple) else (self.output_size, self.output_size)
        out_h, out_w = (height if size[0] is None else size[0]), (width if size[1] is None else size[1])
        if height % out_h == 0 and width % out_w == 0:
            kernel = (height // out_h, width // out_w)
            return F.avg_pool2d(x, kernel, stride=kernel)
        rows = averaging_matrix(height, out_h, x.dtype, x.device)
        cols = averaging_matrix(width, out_w, x.dtype, x.device)
        with torch.autocast(x.device.type, enabled=False):  # average in the input's precision, as the pool does
            return rows @ x @ cols.T


def averaging_matrix(size: int, out: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``(out, size)``: row ``i`` averages adaptive pooling's bin ``i`` of a side of ``size``."""
    index = torch.arange(size, device=device)
    starts = torch.arange(out, device=device) * size // out
    ends = -((-(torch.arange(out, device=device) + 1) * size) // out)  # ceil((i + 1) * size / out)
    inside = (index >= starts[:, None]) & (index < ends[:, None])
    return (inside / (ends - starts)[:, None]).to(dtype)


def deterministic_pools(model: nn.Module) -> int:
    """Swap every ``nn.AdaptiveAvgPool2d`` of ``model`` for the deterministic one (no parameters
    or buffers: checkpoints are unchanged); returns how many were swapped."""
    swapped = replace_modules(model, {nn.AdaptiveAvgPool2d: lambda pool: DeterministicAdaptiveAvgPool2d(
        pool.output_size)})
    return len(swapped)
