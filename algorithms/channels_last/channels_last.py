"""ChannelsLast: store 4-d weights and activations as NHWC.

Many convolution kernels (cuDNN with tensor cores, oneDNN on CPU) run faster on NHWC. The
model's 4-d parameters and buffers are converted once, before the model is wrapped; inputs are
converted after the data loader so the first convolution needs no layout change. Activations
then stay NHWC through the network because PyTorch propagates the memory format.
"""

from __future__ import annotations

import warnings

import torch

from algorithms.base import Algorithm, AlgorithmState, NoEffectWarning
from algorithms.events import Event


def apply_channels_last(model: torch.nn.Module) -> torch.nn.Module:
    """Convert ``model``'s 4-d parameters and buffers to ``torch.channels_last`` in place.

    Same name and signature as Composer's ``apply_channels_last``; returns the model for
    chaining. Warns ``NoEffectWarning`` if the model has no 4-d tensor to convert.
    """
    has_4d = any(t.dim() == 4 for t in (*model.parameters(), *model.buffers()))
    if not has_4d:
        warnings.warn(NoEffectWarning(
            f"ChannelsLast found no 4-d parameters or buffers in {type(model).__name__}; it changes nothing"))
        return model
    # Module.to(memory_format=...) converts only 4-d tensors and keeps Parameter identity,
    # so an optimizer built earlier would still see the same objects.
    return model.to(memory_format=torch.channels_last)


class ChannelsLast(Algorithm):
    """Converts the model at INIT (before wrapping) and each 4-d input batch after loading."""

    name = "channels_last"
    events = frozenset({Event.INIT, Event.AFTER_DATALOADER})
    changes_model = True

    def apply(self, event: Event, state: AlgorithmState) -> None:
        if event is Event.INIT:
            apply_channels_last(state.model)
        elif isinstance(state.inputs, torch.Tensor) and state.inputs.dim() == 4:
            state.inputs = state.inputs.contiguous(memory_format=torch.channels_last)
