"""The catalog: every model, data set and algorithm name Tessera knows, with its metadata.

The catalog is the single list of names. Specs validate against it, ``GET /api/v1/{models,
datasets,algorithms}`` serve it, and tests assert that ``workers`` and ``algorithms``
implement exactly these names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Maturity = Literal["stable", "beta", "prototype"]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    domain: Literal["vision", "text"]
    architecture: Literal["cnn", "transformer"]
    summary: str


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    domain: Literal["vision", "text"]
    summary: str
    num_classes: int
    channels: int
    image_size: int
    num_train: int
    num_test: int


@dataclass(frozen=True)
class AlgorithmInfo:
    name: str
    title: str
    domain: Literal["vision", "text", "any"]
    summary: str
    maturity: Maturity
    attribution: str
    needs: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    changes_model: bool = False  # surgery: runs before wrapping, replayed on resume
    extra: dict[str, Any] = field(default_factory=dict)


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("cifar_resnet20", "vision", "cnn", "ResNet-20 for 32x32 images (He et al. 2016), ~0.27M params"),
        ModelInfo("resnet18", "vision", "cnn", "torchvision ResNet-18 (random init), stem adapted to small images"),
        ModelInfo("simple_cnn", "vision", "cnn", "two conv layers + MLP head; fast enough for unit tests"),
    )
}

DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo("digits", "vision", "scikit-learn's bundled 8x8 handwritten digits, upsampled to image_size",
                    num_classes=10, channels=1, image_size=32, num_train=1437, num_test=360),
        DatasetInfo("fashion_mnist", "vision", "Fashion-MNIST from Debian's dataset-fashion-mnist (idx.gz files)",
                    num_classes=10, channels=1, image_size=28, num_train=60000, num_test=10000),
        DatasetInfo("synthetic", "vision", "class-conditional Gaussian images, learnable, any shape",
                    num_classes=10, channels=3, image_size=32, num_train=1024, num_test=256),
    )
}

ALGORITHMS: dict[str, AlgorithmInfo] = {
    a.name: a
    for a in (
        AlgorithmInfo("channels_last", "ChannelsLast", "vision",
                      "Stores conv weights and activations as NHWC, which many conv kernels run faster on.",
                      "stable", "PyTorch memory-format docs", changes_model=True),
        AlgorithmInfo("label_smoothing", "LabelSmoothing", "any",
                      "Moves a fraction of each target's probability mass to the uniform distribution.",
                      "stable", "Szegedy et al. 2016, https://arxiv.org/abs/1512.00567",
                      needs=("classification",)),
        AlgorithmInfo("cutmix", "CutMix", "vision",
                      "Pastes a box from another example into each image and mixes targets by area.",
                      "stable", "Yun et al. 2019, https://arxiv.org/abs/1905.04899",
                      needs=("classification",)),
    )
}


def as_dict(info: Any) -> dict[str, Any]:
    """A catalog entry as plain JSON-ready data."""
    data = asdict(info)
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return data
