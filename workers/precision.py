"""Mixed precision: the autocast context for the forward pass and the GradScaler for fp16.

bf16 has fp32's exponent range, so its gradients need no scaling; fp16 gradients underflow
without a ``GradScaler``. Both run on CPU too (``torch.amp.GradScaler("cpu")``).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from api.specs import Precision

AUTOCAST_DTYPES = {Precision.AMP_BF16: torch.bfloat16, Precision.AMP_FP16: torch.float16}


def autocast(precision: Precision | str, device: torch.device) -> ContextManager:
    """Context for forward and loss: ``torch.autocast`` on ``device``'s type, or nothing for fp32."""
    precision = Precision(precision)
    if precision is Precision.FP32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(precision: Precision | str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler enabled only for fp16. A disabled scaler passes everything through; the
    trainer's step skips its calls then (``Trainer.scaling``), algorithms may still call it."""
    return torch.amp.GradScaler(device.type, enabled=Precision(precision) is Precision.AMP_FP16)
