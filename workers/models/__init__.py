"""Model registry: ``build_model(spec, num_classes=..., in_channels=...)``.

Names equal ``api.catalog.MODELS``'s keys; each spec's ``params`` are the builder's keyword
arguments. Vision models take ``num_classes`` and ``in_channels``; text models take
``num_classes`` as their vocabulary size.
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn

from api.catalog import MODELS
from workers.models.cifar_resnet import cifar_resnet20
from workers.models.gpt import gpt_small
from workers.models.resnet import resnet18
from workers.models.simple_cnn import simple_cnn

MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "cifar_resnet20": cifar_resnet20,
    "gpt_small": gpt_small,
    "resnet18": resnet18,
    "simple_cnn": simple_cnn,
}


def build_model(spec: Any, *, num_classes: int, in_channels: int) -> nn.Module:
    """The model an ``api.specs.ModelSpec`` describes, for the data's classes (or vocabulary) and channels."""
    try:
        builder = MODEL_BUILDERS[spec.name]
    except KeyError:
        raise ValueError(f"unknown model {spec.name!r}; known: {', '.join(sorted(MODEL_BUILDERS))}") from None
    if MODELS[spec.name].domain == "text":
        return builder(num_classes=num_classes, **spec.params.model_dump())
    return builder(num_classes=num_classes, in_channels=in_channels, **spec.params.model_dump())


__all__ = ["MODEL_BUILDERS", "build_model", "cifar_resnet20", "gpt_small", "resnet18", "simple_cnn"]
