"""What ``deterministic: true`` changes in a model on a CUDA device.

``torch.use_deterministic_algorithms(True)`` makes PyTorch refuse any CUDA kernel that has no
deterministic version, at the first step. ``AdaptiveAvgPool2d``'s backward pass is one of them
(it adds gradients with atomics) for every output size but 1x1, which PyTorch computes as a
mean: a global average pool (torchvision's ResNets, squeeze-excite) passes, but a pool to a
grid, such as ``simple_cnn``'s ``AdaptiveAvgPool2d(4)``, failed a deterministic run on a GPU at
once. ``deterministic_pools`` swaps each ``AdaptiveAvgPool2d`` for
``DeterministicAdaptiveAvgPool2d``, which computes the same averages with kernels whose backward
passes are deterministic. Other operations without a deterministic CUDA kernel (for instance
``AdaptiveMaxPool2d``) still fail the run with PyTorch's error, which names them.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.surgery import replace_modules


class DeterministicAdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` with a deterministic backward pass on CUDA.

    Where each input side is a multiple of the output side, the bins are equal and disjoint:
    ``avg_pool2d`` with kernel = stride = input // output gives the same averages. Otherwise it
    multiplies by one averaging matrix per side: row ``i`` holds ``1/len`` over bin ``i``, the
    bins PyTorch uses (``floor(i*n/out)`` to ``ceil((i+1)*n/out)``), in fp32 whatever the
    input's type, as PyTorch's pool sums in fp32 for bf16 and fp16 inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        size = (tuple(self.output_size) if isinstance(self.output_size, (tuple, list))
                else (self.output_size, self.output_size))
        out_h, out_w = (height if size[0] is None else size[0]), (width if size[1] is None else size[1])
        if height % out_h == 0 and width % out_w == 0:
            kernel = (height // out_h, width // out_w)
            return F.avg_pool2d(x, kernel, stride=kernel)
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        rows = averaging_matrix(height, out_h, dtype, x.device)
        cols = averaging_matrix(width, out_w, dtype, x.device)
        with torch.autocast(x.device.type, enabled=False):  # autocast would multiply in bf16/fp16
            return (rows @ x.to(dtype) @ cols.T).to(x.dtype)


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
