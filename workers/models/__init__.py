"""Model registry: ``build_model(spec, num_classes=..., in_channels=...)``.

Names equal ``api.catalog.MODELS``'s keys; each spec's ``params`` are the builder's keyword
arguments. Vision models take ``num_classes`` and ``in_channels``; text models take
``num_classes`` as their vocabulary size. ``torchvision`` builds any torchvision architecture
(``torchvision_models``); a spec with ``import`` calls your own code (``user_code``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn

from api.catalog import MODELS
from api.model_specs import ImportedModelSpec
from workers.models.cifar_resnet import cifar_resnet20
from workers.models.gpt import gpt_small
from workers.models.resnet import resnet18
from workers.models.simple_cnn import simple_cnn
from workers.models.torchvision_models import torchvision_model
from workers.models.user_code import build_user_model

MODEL_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "cifar_resnet20": cifar_resnet20,
    "gpt_small": gpt_small,
    "resnet18": resnet18,
    "simple_cnn": simple_cnn,
    "torchvision": torchvision_model,
}


def build_model(spec: Any, *, num_classes: int, in_channels: int, image_size: int | None = None,
                domain: str | None = None) -> nn.Module:
    """The model an ``api.specs.ModelSpec`` describes, for the data's classes (or vocabulary) and
    channels; ``image_size`` picks small-image stems, ``domain`` (the data's) how to call your code."""
    if isinstance(spec, ImportedModelSpec):
        return build_user_model(spec, num_classes=num_classes, in_channels=in_channels, domain=domain or "vision")
    if spec.name == "torchvision":
        return torchvision_model(num_classes, in_channels, spec.arch, small_input_stem=spec.small_input_stem,
                                 params=spec.params, image_size=image_size)
    try:
        builder = MODEL_BUILDERS[spec.name]
    except KeyError:
        raise ValueError(f"unknown model {spec.name!r}; known: {', '.join(sorted(MODEL_BUILDERS))}") from None
    if MODELS[spec.name].domain == "text":
        return builder(num_classes=num_classes, **spec.params.model_dump())
    return builder(num_classes=num_classes, in_channels=in_channels, **spec.params.model_dump())


__all__ = ["MODEL_BUILDERS", "build_model", "cifar_resnet20", "gpt_small", "resnet18", "simple_cnn",
           "torchvision_model"]
