"""LowPrecisionGroupNorm: run GroupNorm in the autocast dtype (bf16/fp16) instead of fp32.

The same idea and rules as LowPrecisionLayerNorm (``algorithms.low_precision_layernorm``):
``nn.GroupNorm`` becomes ``LPGroupNorm`` in place; the Algorithm acts only on CUDA with 16-bit
autocast and leaves a "no effect" note elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.low_precision_layernorm.low_precision_layernorm import LowPrecisionNorm, _low, convert_norms


class LPGroupNorm(nn.GroupNorm):
    """GroupNorm computed in the autocast dtype when autocast is on."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(x)
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return F.group_norm(x.to(dtype), self.num_groups, _low(self.weight, dtype), _low(self.bias, dtype),
                                self.eps)


def apply_low_precision_groupnorm(model: nn.Module, precision: Any = None, optimizers: Any = None) -> nn.Module:
    """Make every ``nn.GroupNorm`` run in the autocast dtype when ``precision`` is amp_bf16/amp_fp16.

    Composer's name and signature (``optimizers`` is accepted for parity: parameters do not change).
    ``precision`` None (Composer's default) or fp32 changes nothing and warns ``NoEffectWarning``.
    """
    return convert_norms(model, nn.GroupNorm, LPGroupNorm, precision, "LowPrecisionGroupNorm")


class LowPrecisionGroupNorm(LowPrecisionNorm):
    """Runs the model's GroupNorms in the autocast dtype (CUDA, amp_bf16/amp_fp16)."""

    name = "low_precision_groupnorm"
    title = "LowPrecisionGroupNorm"
    convert = staticmethod(apply_low_precision_groupnorm)
