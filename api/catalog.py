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
    # Works on the pixels of the input images (N, C, H, W) themselves: your own data set of
    # feature vectors (items (F,)) cannot use it (the worker refuses it at the start).
    needs_images: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("cifar_resnet20", "vision", "cnn", "ResNet-20 for 32x32 images (He et al. 2016), ~0.27M params"),
        ModelInfo("gpt_small", "text", "transformer",
                  "small GPT (our attention, learned position embeddings), causal LM; ~0.8M params at defaults"),
        ModelInfo("resnet18", "vision", "cnn", "torchvision ResNet-18 (random init), stem adapted to small images"),
        ModelInfo("simple_cnn", "vision", "cnn", "two conv layers + MLP head; fast enough for unit tests"),
        ModelInfo("torchvision", "vision", "cnn",
                  "any torchvision classification architecture by `arch` (random init; ResNets get a small-image "
                  "stem under 64px); or bring your own code with {import: 'pkg.module:callable'}"),
    )
}

DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in (
        DatasetInfo("digits", "vision", "scikit-learn's bundled 8x8 handwritten digits, upsampled to image_size",
                    num_classes=10, channels=1, image_size=32, num_train=1437, num_test=360),
        # Text: num_classes is the vocabulary; channels/image_size do not apply (0); counts at seq_len 128.
        DatasetInfo("shakespeare", "text", "42 plays, character-level (84 characters); 90/10 split of each play",
                    num_classes=84, channels=0, image_size=0, num_train=35558, num_test=3951),
        DatasetInfo("fashion_mnist", "vision", "Fashion-MNIST from Debian's dataset-fashion-mnist (idx.gz files)",
                    num_classes=10, channels=1, image_size=28, num_train=60000, num_test=10000),
        DatasetInfo("synthetic", "vision", "class-conditional Gaussian images, learnable, any shape",
                    num_classes=10, channels=3, image_size=32, num_train=1024, num_test=256),
        # Brought by the user: classes, channels, sizes and counts come from the spec and the data (0 here).
        DatasetInfo("image_folder", "vision", "your images in root/<class>/<file> folders, local or s3://, "
                    "decoded by DataLoader workers", num_classes=0, channels=0, image_size=0, num_train=0, num_test=0),
        DatasetInfo("webdataset", "vision", "your WebDataset tar shards (image + integer label per sample), "
                    "streamed from local disk or s3://", num_classes=0, channels=0, image_size=0, num_train=0,
                    num_test=0),
    )
}

_WEIGHT_AVERAGES = ("both replace the weights that are evaluated with an average of past weights: EMA swaps its "
                    "average in for every evaluation, SWA loads its average into the model at swa_end")

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
                      needs=("classification",), needs_images=True),
        AlgorithmInfo("alibi", "ALiBi", "text",
                      "Replaces position embeddings with per-head linear attention biases and trains on "
                      "shorter sequences, extrapolating to longer ones at evaluation.",
                      "beta", "Press et al. 2022, https://arxiv.org/abs/2108.12409",
                      needs=("transformer",), changes_model=True),
        AlgorithmInfo("blurpool", "BlurPool", "vision",
                      "Blurs before strided convolutions and max-pools (anti-aliasing) for shift-invariance.",
                      "stable", "Zhang 2019, https://arxiv.org/abs/1904.11486", changes_model=True),
        AlgorithmInfo("factorize", "Factorize", "any",
                      "Splits wide Linear and Conv2d layers into two low-rank layers with fewer multiply-adds.",
                      "prototype", "low-rank factorization as in MosaicML Composer; Jaderberg et al. 2014, "
                      "https://arxiv.org/abs/1405.3866", changes_model=True),
        AlgorithmInfo("mixup", "MixUp", "vision",
                      "Trains on convex combinations of pairs of examples and of their targets.",
                      "stable", "Zhang et al. 2018, https://arxiv.org/abs/1710.09412",
                      needs=("classification",)),
        AlgorithmInfo("cutout", "CutOut", "vision",
                      "Zeroes random square holes of the images.",
                      "stable", "DeVries & Taylor 2017, https://arxiv.org/abs/1708.04552", needs_images=True),
        AlgorithmInfo("colout", "ColOut", "vision",
                      "Drops random rows and columns of the images: smaller inputs, the same content.",
                      "beta", "MosaicML Composer method card, https://docs.mosaicml.com/projects/composer/",
                      needs_images=True),
        AlgorithmInfo("augmix", "AugMix", "vision",
                      "Mixes each image with Dirichlet blends of random augmentation chains, per example.",
                      "beta", "Hendrycks et al. 2020, https://arxiv.org/abs/1912.02781", needs_images=True),
        AlgorithmInfo("progressive_resizing", "ProgressiveResizing", "vision",
                      "Trains on downscaled images early and grows them to full size, per batch.",
                      "stable", "MosaicML Composer; Touvron et al. 2019, https://arxiv.org/abs/1906.06423",
                      needs_images=True),
        AlgorithmInfo("ema", "EMA", "any",
                      "Evaluates with an exponential moving average of the weights.",
                      "stable", "Polyak & Juditsky 1992; Tan & Le 2019, https://arxiv.org/abs/1905.11946",
                      conflicts=("swa",), extra={"conflict_reasons": {"swa": _WEIGHT_AVERAGES}}),
        AlgorithmInfo("swa", "SWA", "any",
                      "Averages the weights visited late in training, then recomputes BatchNorm statistics.",
                      "beta", "Izmailov et al. 2018, https://arxiv.org/abs/1803.05407",
                      conflicts=("ema",), extra={"conflict_reasons": {"ema": _WEIGHT_AVERAGES}}),
        AlgorithmInfo("gradient_clipping", "GradientClipping", "any",
                      "Clips the batch's gradients before the optimizer step: by global norm, by value, "
                      "or per unit relative to the weights (AGC).",
                      "stable", "Pascanu et al. 2013, https://arxiv.org/abs/1211.5063; AGC: Brock et al. 2021, "
                      "https://arxiv.org/abs/2102.06171"),
        AlgorithmInfo("layer_freezing", "LayerFreezing", "any",
                      "Stops training the earliest layers progressively, more of them as training goes on.",
                      "beta", "Brock et al. 2017 (FreezeOut), https://arxiv.org/abs/1706.04983; Raghu et al. 2017, "
                      "https://arxiv.org/abs/1706.05806"),
        AlgorithmInfo("stochastic_depth", "StochasticDepth", "vision",
                      "Randomly skips residual blocks (or drops examples inside them) while training; "
                      "evaluates with every block, scaled by its survival probability.",
                      "beta", "Huang et al. 2016, https://arxiv.org/abs/1603.09382",
                      needs=("residual_blocks",), changes_model=True),
        AlgorithmInfo("squeeze_excite", "SqueezeExcite", "vision",
                      "Adds channel attention after wide convolutions: each channel is scaled by a gate "
                      "computed from the pooled image.",
                      "beta", "Hu et al. 2018, https://arxiv.org/abs/1709.01507", changes_model=True),
        AlgorithmInfo("ghost_batchnorm", "GhostBatchNorm", "vision",
                      "Normalizes each small slice of the batch with its own BatchNorm statistics while "
                      "training: small-batch regularization with large-batch steps.",
                      "beta", "Hoffer et al. 2017, https://arxiv.org/abs/1705.08741",
                      needs=("batchnorm",), changes_model=True),
        AlgorithmInfo("weight_standardization", "WeightStandardization", "vision",
                      "Standardizes each convolution filter's weights (zero mean, unit variance) at every use.",
                      "prototype", "Qiao et al. 2019, https://arxiv.org/abs/1903.10520", changes_model=True),
        AlgorithmInfo("sam", "SAM", "any",
                      "Sharpness-aware minimization: each step uses the gradient at the worst weights within "
                      "rho, preferring flat minima; two forward/backward passes per SAM step.",
                      "beta", "Foret et al. 2021, https://arxiv.org/abs/2010.01412"),
        AlgorithmInfo("low_precision_layernorm", "LowPrecisionLayerNorm", "any",
                      "Runs LayerNorm in the autocast dtype (bf16/fp16) instead of fp32 on CUDA; "
                      "a noted no-op on CPU or in fp32.",
                      "prototype", "MosaicML Composer, https://docs.mosaicml.com/projects/composer/",
                      changes_model=True),
        AlgorithmInfo("low_precision_groupnorm", "LowPrecisionGroupNorm", "any",
                      "Runs GroupNorm in the autocast dtype (bf16/fp16) instead of fp32 on CUDA; "
                      "a noted no-op on CPU or in fp32.",
                      "prototype", "MosaicML Composer, https://docs.mosaicml.com/projects/composer/",
                      changes_model=True),
        AlgorithmInfo("fused_layernorm", "FusedLayerNorm", "any",
                      "Replaces LayerNorm with NVIDIA apex's fused kernel on CUDA; a noted no-op without "
                      "CUDA or apex.",
                      "prototype", "NVIDIA apex; MosaicML Composer, https://docs.mosaicml.com/projects/composer/",
                      changes_model=True),
        AlgorithmInfo("seq_length_warmup", "SeqLengthWarmup", "text",
                      "Trains a language model on short sequences first and grows them linearly to full length.",
                      "beta", "Li, Zhang & He 2022, https://arxiv.org/abs/2108.06084"),
        AlgorithmInfo("selective_backprop", "SelectiveBackprop", "any",
                      "On some steps, scores the batch without gradients and trains only on the examples "
                      "with the highest loss.",
                      "prototype", "Jiang et al. 2019, https://arxiv.org/abs/1910.00762",
                      needs=("classification",)),
        AlgorithmInfo("randaugment", "RandAugment", "vision",
                      "Applies a few random augmentations of fixed strength to every training image.",
                      "beta", "Cubuk et al. 2020, https://arxiv.org/abs/1909.13719", needs_images=True),
        AlgorithmInfo("gated_linear_units", "GatedLinearUnits", "any",
                      "Turns each transformer feed-forward block into a gated linear unit: the hidden layer "
                      "is an activated gate times a linear projection.",
                      "prototype", "Shazeer 2020, https://arxiv.org/abs/2002.05202",
                      needs=("transformer",), changes_model=True),
        AlgorithmInfo("gyro_dropout", "GyroDropout", "any",
                      "Replaces dropout's fresh random masks with a fixed set of pre-selected subnetworks, "
                      "a few of them trained at a time, each about equally often.",
                      "prototype", "Lee et al. 2022, \"Gyro Dropout: Maximizing Ensemble Effect in Neural Network "
                      "Training\", MLSys 2022",
                      needs=("dropout",), changes_model=True),
    )
}


# Residual block types (StochasticDepth's target_layer_name) in each built-in model; a model
# missing here has none. torchvision architectures are looked up by ``residual_blocks_of_arch``.
MODEL_RESIDUAL_BLOCKS: dict[str, frozenset[str]] = {
    "cifar_resnet20": frozenset({"CifarResNetBasicBlock"}),
    "resnet18": frozenset({"ResNetBasicBlock"}),
}


def residual_blocks_of_arch(arch: str) -> frozenset[str]:
    """The residual block types of a torchvision classification architecture (none for most)."""
    if arch in ("resnet18", "resnet34"):
        return frozenset({"ResNetBasicBlock"})
    if arch.startswith(("resnet", "resnext", "wide_resnet")):
        return frozenset({"ResNetBottleneck"})
    return frozenset()


# Built-in models and torchvision architectures known to have no BatchNorm (GhostBatchNorm needs
# one); any other torchvision architecture may have some, and the surgery reports if it finds none.
MODELS_WITHOUT_BATCHNORM = frozenset({"simple_cnn", "gpt_small"})
_ARCHS_WITHOUT_BATCHNORM = ("alexnet", "squeezenet", "vit_", "swin_", "convnext_")


def arch_lacks_batchnorm(arch: str) -> bool:
    """True for torchvision architectures known to have no BatchNorm layer."""
    plain_vgg = arch.startswith("vgg") and not arch.endswith("_bn")
    return plain_vgg or arch.startswith(_ARCHS_WITHOUT_BATCHNORM)


# Built-in models and torchvision architectures known to have no ``nn.Dropout`` layer (GyroDropout
# replaces them); any other architecture may have some, and the surgery reports if it finds none.
MODELS_WITHOUT_DROPOUT = frozenset({"cifar_resnet20", "resnet18", "simple_cnn"})
_ARCHS_WITHOUT_DROPOUT = ("resnet", "resnext", "wide_resnet", "regnet", "shufflenet", "densenet", "convnext")


def arch_lacks_dropout(arch: str) -> bool:
    """True for torchvision architectures known to have no ``nn.Dropout`` layer."""
    return arch.startswith(_ARCHS_WITHOUT_DROPOUT)


def as_dict(info: Any) -> dict[str, Any]:
    """A catalog entry as plain JSON-ready data."""
    data = asdict(info)
    for key, value in data.items():
        if isinstance(value, tuple):
            data[key] = list(value)
    return data
