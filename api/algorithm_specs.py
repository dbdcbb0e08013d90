"""One pydantic spec per speedup method, joined in a discriminated union on ``name``.

Each spec holds the method's hyperparameters with their allowed ranges; the worker builds
the matching ``Algorithm`` from it (``algorithms.registry``). Adding a method means adding a
spec here, an entry in ``api.catalog.ALGORITHMS`` and a folder under ``algorithms/``; a test
checks the three agree.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.time import OffsetTime, Time, TimeUnit, time_field

BatchOrEpochTime = time_field(TimeUnit.BATCH, TimeUnit.EPOCH, positive=True, example="1000ba")
EpochOrDurationTime = time_field(TimeUnit.EPOCH, TimeUnit.DURATION, example="0.7dur")


class _AlgorithmSpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Fields of a surgery method that change how its new tensors start, never their shapes: left
    # out of the checkpoint fingerprint (``workers.checkpoint.contents.fingerprint``), since a
    # checkpoint's tensors overwrite them on resume anyway.
    not_in_fingerprint: ClassVar[frozenset[str]] = frozenset()


class ChannelsLastSpec(_AlgorithmSpecBase):
    """Convert the model's 4-d parameters and buffers to NHWC memory format."""

    name: Literal["channels_last"]


class LabelSmoothingSpec(_AlgorithmSpecBase):
    """Blend one-hot targets with the uniform distribution before the loss."""

    name: Literal["label_smoothing"]
    smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="mass moved to the uniform distribution")


class CutMixSpec(_AlgorithmSpecBase):
    """Paste a random box from a shuffled copy of the batch; mix targets by box area."""

    name: Literal["cutmix"]
    alpha: float = Field(1.0, gt=0.0, description="Beta(alpha, alpha) concentration for the kept area")
    uniform_sampling: bool = Field(False, description="sample box centres so every pixel is equally likely to be cut")


class AlibiSpec(_AlgorithmSpecBase):
    """Replace position embeddings with per-head linear attention biases; train on shorter sequences."""

    name: Literal["alibi"]
    max_sequence_length: int = Field(1024, ge=2, le=65536,
                                     description="longest sequence the converted model accepts (train and eval)")
    train_sequence_length_scaling: float = Field(
        0.25, gt=0.0, le=1.0, description="train on rows of this fraction of the data's seq_len (1.0: unchanged)")


class BlurPoolSpec(_AlgorithmSpecBase):
    """Anti-alias strided convolutions and max-pools with a 3x3 binomial blur."""

    name: Literal["blurpool"]
    replace_convs: bool = Field(True, description="blur strided Conv2d layers")
    replace_maxpools: bool = Field(True, description="replace MaxPool2d with blurred max-pooling")
    blur_first: bool = Field(True, description="blur before the strided conv (cheap) rather than after a stride-1 conv")
    min_channels: int = Field(16, ge=1, description="leave convs with fewer input channels alone (e.g. the stem)")

    @model_validator(mode="after")
    def _replaces_something(self) -> "BlurPoolSpec":
        if not (self.replace_convs or self.replace_maxpools):
            raise ValueError("replace_convs and replace_maxpools are both false: blurpool would change nothing")
        return self


def _check_latent(value: int | float, field: str, max_fraction: float) -> int | float:
    if isinstance(value, float) and not 0.0 < value < max_fraction:
        raise ValueError(f"{field} {value}: a fraction must lie in (0, {max_fraction}); "
                         "or give a number of latent units as an integer >= 1")
    if isinstance(value, int) and value < 1:
        raise ValueError(f"{field} {value}: a number of latent units must be >= 1")
    return value


class FactorizeSpec(_AlgorithmSpecBase):
    """Replace wide Linear and Conv2d layers with two low-rank layers (fewer multiply-adds)."""

    name: Literal["factorize"]
    not_in_fingerprint: ClassVar[frozenset[str]] = frozenset({"init"})
    factorize_convs: bool = True
    factorize_linears: bool = True
    min_channels: int = Field(256, ge=1, description="skip convs with fewer input or output channels")
    latent_channels: int | float = Field(
        0.25, description="latent channels: an integer, or a fraction in (0, 1) of min(in, out) channels")
    min_features: int = Field(256, ge=1, description="skip linears with fewer input or output features")
    latent_features: int | float = Field(
        128, description="latent features: an integer, or a fraction in (0, 0.5) of min(in, out) features")
    init: Literal["random", "lowrank", "svd"] = Field(
        "random", description="how the two new layers start: 'random' (fresh, as Composer; fast), 'lowrank' "
                              "(randomized approximation of the old weight) or 'svd' (its best approximation; slow)")

    @field_validator("latent_channels")
    @classmethod
    def _latent_channels(cls, value: int | float) -> int | float:
        return _check_latent(value, "latent_channels", 1.0)

    @field_validator("latent_features")
    @classmethod
    def _latent_features(cls, value: int | float) -> int | float:
        return _check_latent(value, "latent_features", 0.5)

    @model_validator(mode="after")
    def _factorizes_something(self) -> "FactorizeSpec":
        if not (self.factorize_convs or self.factorize_linears):
            raise ValueError("factorize_convs and factorize_linears are both false: factorize would change nothing")
        return self


class MixUpSpec(_AlgorithmSpecBase):
    """Train on convex combinations of pairs of examples and of their targets."""

    name: Literal["mixup"]
    alpha: float = Field(0.2, gt=0.0, le=100.0, description="Beta(alpha, alpha) concentration of the mixing weight")


class CutOutSpec(_AlgorithmSpecBase):
    """Zero square holes of every image (the same holes for the whole batch)."""

    name: Literal["cutout"]
    num_holes: int = Field(1, ge=1, le=64, description="holes per image")
    length: float = Field(0.5, gt=0.0, le=1.0, description="side of a hole as a fraction of min(H, W)")
    uniform_sampling: bool = Field(False, description="sample hole centres so every pixel is equally likely to be cut")


class ColOutSpec(_AlgorithmSpecBase):
    """Drop a random fraction of the rows and columns of each image."""

    name: Literal["colout"]
    p_row: float = Field(0.15, ge=0.0, lt=1.0, description="fraction of rows dropped")
    p_col: float = Field(0.15, ge=0.0, lt=1.0, description="fraction of columns dropped")
    batch: bool = Field(True, description="same rows/columns for the whole batch, on the device (else per example)")
    resize_target: bool | Literal["auto"] = Field(
        "auto", description="drop the same rows/columns from spatial targets ('auto': when shapes match)")

    @model_validator(mode="after")
    def _target_needs_batch_mode(self) -> "ColOutSpec":
        if self.resize_target is True and not self.batch:
            raise ValueError("colout resize_target: true needs batch: true (per-example mode sees images only)")
        return self


class AugMixSpec(_AlgorithmSpecBase):
    """Mix each image with a Dirichlet blend of random augmentation chains (per example)."""

    name: Literal["augmix"]
    severity: int = Field(3, ge=0, le=10, description="strength of each augmentation")
    depth: int = Field(-1, ge=-1, le=10, description="operations per chain; -1 draws 1 to 3")
    width: int = Field(3, ge=1, le=16, description="number of chains blended")
    alpha: float = Field(1.0, gt=0.0, le=100.0, description="Dirichlet/Beta concentration of the mixing weights")
    augmentation_set: Literal["all", "safe", "original"] = Field(
        "all", description="'safe' leaves out operations that overlap ImageNet-C/CIFAR-10-C corruptions")

    @field_validator("depth")
    @classmethod
    def _depth_not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("depth 0 would apply no augmentation; use -1 (random 1-3) or a positive count")
        return value


class ProgressiveResizingSpec(_AlgorithmSpecBase):
    """Train on downscaled images early, growing them to full size by the end."""

    name: Literal["progressive_resizing"]
    mode: Literal["resize", "crop"] = Field("resize", description="nearest-neighbour downscale, or a random crop")
    initial_scale: float = Field(0.5, gt=0.0, le=1.0, description="image scale at the start")
    finetune_fraction: float = Field(0.2, ge=0.0, le=1.0, description="final fraction of training at full size")
    delay_fraction: float = Field(0.5, ge=0.0, le=1.0, description="initial fraction of training at initial_scale")
    size_increment: int = Field(4, ge=1, le=256, description="image widths are rounded to a multiple of this")
    resize_targets: bool = Field(False, description="also resize spatial targets (segmentation)")

    @model_validator(mode="after")
    def _fractions_fit(self) -> "ProgressiveResizingSpec":
        if self.delay_fraction + self.finetune_fraction > 1.0:
            raise ValueError(f"delay_fraction {self.delay_fraction} + finetune_fraction {self.finetune_fraction} "
                             "exceeds 1; they are shares of the same run")
        return self


class EMASpec(_AlgorithmSpecBase):
    """Evaluate with an exponential moving average of the weights."""

    name: Literal["ema"]
    half_life: BatchOrEpochTime | None = Field(
        Time(1000, TimeUnit.BATCH), description="time for an old weight's share to halve ('1000ba'); or give smoothing")
    smoothing: float | None = Field(None, gt=0.0, lt=1.0,
                                    description="weight kept per update: ema = s * ema + (1 - s) * w; excludes half_life")
    ema_start: OffsetTime = Field(Time(0.0, TimeUnit.DURATION), description="when averaging starts, e.g. '0.5dur'")
    update_interval: BatchOrEpochTime | None = Field(
        None, description="how often to update; default one unit of half_life ('1ba' or '1ep')")

    @model_validator(mode="after")
    def _half_life_or_smoothing(self) -> "EMASpec":
        if self.smoothing is not None and "half_life" not in self.model_fields_set:
            self.half_life = None  # smoothing given alone replaces the default half-life
        if self.smoothing is not None and self.half_life is not None:
            raise ValueError("ema: give half_life or smoothing, not both")
        if self.smoothing is None and self.half_life is None:
            raise ValueError("ema: give half_life (e.g. '1000ba') or smoothing (e.g. 0.999)")
        if (self.half_life is not None and self.update_interval is not None
                and self.half_life.unit is not self.update_interval.unit):
            raise ValueError(f"ema: half_life {self.half_life} and update_interval {self.update_interval} "
                             "must use the same unit")
        return self


class SWASpec(_AlgorithmSpecBase):
    """Average the weights late in training, then recompute BatchNorm statistics."""

    name: Literal["swa"]
    swa_start: EpochOrDurationTime = Field(Time(0.7, TimeUnit.DURATION), description="when averaging starts")
    swa_end: EpochOrDurationTime = Field(Time(0.97, TimeUnit.DURATION),
                                         description="when the average replaces the weights (same unit as swa_start)")
    update_interval: BatchOrEpochTime = Field(Time(1, TimeUnit.EPOCH), description="how often a snapshot is averaged")
    schedule_swa_lr: bool = Field(False, description="anneal the learning rate to swa_lr with SWALR while averaging")
    anneal_strategy: Literal["linear", "cos"] = "linear"
    anneal_steps: int = Field(10, ge=1, le=100_000, description="SWALR steps (updates) to reach swa_lr")
    swa_lr: float | None = Field(None, gt=0.0, le=100.0, description="default: the learning rate when SWA starts")
    bn_update_batches: int | None = Field(
        None, ge=1, le=1_000_000, description="training batches of the pass that recomputes BatchNorm statistics "
                                              "at swa_end (per rank); null: a whole epoch of this rank's shard")

    @model_validator(mode="after")
    def _start_before_end(self) -> "SWASpec":
        if self.swa_start.unit is not self.swa_end.unit:
            raise ValueError(f"swa: swa_start {self.swa_start} and swa_end {self.swa_end} must use the same unit")
        if not self.swa_start.value < self.swa_end.value:
            raise ValueError(f"swa: swa_end {self.swa_end} must come after swa_start {self.swa_start}")
        return self


class GradientClippingSpec(_AlgorithmSpecBase):
    """Clip the batch's gradients before the optimizer step: by global norm, by value, or adaptively (AGC)."""

    name: Literal["gradient_clipping"]
    clipping_type: Literal["norm", "value", "adaptive"] = Field(
        "norm", description="'norm': global L2 norm; 'value': each element; 'adaptive': per unit vs its weights (AGC)")
    clipping_threshold: float = Field(1.0, gt=0.0, le=1e6,
                                      description="max norm, max |value|, or AGC's max ratio of gradient to weight norm")


class LayerFreezingSpec(_AlgorithmSpecBase):
    """Freeze the earliest layers progressively, from freeze_start to the end of training."""

    name: Literal["layer_freezing"]
    freeze_start: float = Field(0.5, ge=0.0, lt=1.0, description="fraction of training before freezing starts")
    freeze_level: float = Field(1.0, gt=0.0, le=1.0,
                                description="fraction of layers (all but the head) frozen at the end of training")


class StochasticDepthSpec(_AlgorithmSpecBase):
    """Randomly skip residual blocks (or drop examples inside them) while training."""

    name: Literal["stochastic_depth"]
    target_layer_name: Literal["auto", "ResNetBasicBlock", "ResNetBottleneck", "CifarResNetBasicBlock"] = Field(
        "auto", description="block type to make stochastic; 'auto': every known residual block type")
    stochastic_method: Literal["block", "sample"] = Field(
        "block", description="'block': skip whole blocks; 'sample': drop examples inside every block")
    drop_rate: float = Field(0.2, ge=0.0, le=1.0, description="drop probability (of the deepest block, if linear)")
    drop_distribution: Literal["uniform", "linear"] = Field(
        "linear", description="'linear': block i of n drops with (i + 1) / n * drop_rate; 'uniform': all the same")
    drop_warmup: float = Field(0.0, ge=0.0, lt=1.0,
                               description="fraction of training over which drop rates rise linearly from 0")


class SqueezeExciteSpec(_AlgorithmSpecBase):
    """Add a Squeeze-and-Excitation block (channel gates from the pooled image) after wide convolutions."""

    name: Literal["squeeze_excite"]
    latent_channels: float = Field(64, gt=0.0, le=4096,
                                   description="hidden units of the SE MLP: a count >= 1, or a fraction < 1 of channels")
    min_channels: int = Field(128, ge=1, le=65536,
                              description="only convs with at least this many input and output channels get a block")


class GhostBatchNormSpec(_AlgorithmSpecBase):
    """Normalize each slice of ghost_batch_size examples with its own BatchNorm statistics while training."""

    name: Literal["ghost_batchnorm"]
    ghost_batch_size: int = Field(32, ge=2, le=65536, description="examples per ghost batch (per worker)")


class WeightStandardizationSpec(_AlgorithmSpecBase):
    """Standardize every convolution's weights per output filter at each use."""

    name: Literal["weight_standardization"]
    n_last_layers_ignore: int = Field(0, ge=0, le=10_000,
                                      description="leave the last N convolutions (in execution order) unstandardized")


class SAMSpec(_AlgorithmSpecBase):
    """Sharpness-aware minimization: step with the gradient at the worst weights within rho."""

    name: Literal["sam"]
    rho: float = Field(0.05, gt=0.0, le=10.0, description="radius of the neighbourhood the ascent step reaches")
    epsilon: float = Field(1e-12, gt=0.0, le=1e-3, description="added to the gradient norm for stability")
    interval: int = Field(1, ge=1, le=100_000, description="run SAM every this many steps (others are plain)")


class LowPrecisionLayerNormSpec(_AlgorithmSpecBase):
    """Run LayerNorm in the autocast dtype (CUDA with amp_bf16/amp_fp16; a noted no-op elsewhere)."""

    name: Literal["low_precision_layernorm"]


class LowPrecisionGroupNormSpec(_AlgorithmSpecBase):
    """Run GroupNorm in the autocast dtype (CUDA with amp_bf16/amp_fp16; a noted no-op elsewhere)."""

    name: Literal["low_precision_groupnorm"]


class FusedLayerNormSpec(_AlgorithmSpecBase):
    """Use NVIDIA apex's fused LayerNorm kernel (CUDA with apex installed; a noted no-op elsewhere)."""

    name: Literal["fused_layernorm"]


class SeqLengthWarmupSpec(_AlgorithmSpecBase):
    """Train a language model on short sequences first, growing them to full length."""

    name: Literal["seq_length_warmup"]
    duration: float = Field(0.3, gt=0.0, le=1.0, description="fraction of training over which lengths grow")
    min_seq_length: int = Field(8, ge=1, le=65536, description="sequence length at the start")
    max_seq_length: int = Field(1024, ge=1, le=65536, description="length reached after duration (capped at the data's)")
    step_size: int = Field(8, ge=1, le=65536, description="lengths grow in steps of this many tokens")
    truncate: bool = Field(True, description="drop the rows' ends (true) or reshape rows into shorter ones (false)")

    @model_validator(mode="after")
    def _min_not_above_max(self) -> "SeqLengthWarmupSpec":
        if self.min_seq_length > self.max_seq_length:
            raise ValueError(f"seq_length_warmup: min_seq_length {self.min_seq_length} exceeds max_seq_length "
                             f"{self.max_seq_length}")
        return self


class SelectiveBackpropSpec(_AlgorithmSpecBase):
    """Train some steps on only the highest-loss examples of the batch (scored by a forward without gradients)."""

    name: Literal["selective_backprop"]
    start: float = Field(0.5, ge=0.0, lt=1.0, description="fraction of training when selection starts")
    end: float = Field(0.9, gt=0.0, le=1.0, description="fraction of training when selection stops")
    keep: float = Field(0.5, gt=0.0, le=1.0, description="fraction of each selected batch trained on")
    scale_factor: float = Field(1.0, gt=0.0, le=1.0, description="score on images downscaled by this factor")
    interval: int = Field(2, ge=1, le=100_000, description="select on every this-many-th batch")

    @model_validator(mode="after")
    def _start_before_end(self) -> "SelectiveBackpropSpec":
        if not self.start < self.end:
            raise ValueError(f"selective_backprop: end {self.end} must come after start {self.start}")
        return self


class RandAugmentSpec(_AlgorithmSpecBase):
    """Apply a few random augmentations of fixed strength to every training image (per example)."""

    name: Literal["randaugment"]
    severity: int = Field(9, ge=0, le=10, description="strength of each operation")
    depth: int = Field(2, ge=1, le=10, description="operations applied to each image")
    augmentation_set: Literal["all", "safe", "original"] = Field(
        "all", description="'safe' leaves out operations that overlap ImageNet-C/CIFAR-10-C corruptions")


class GatedLinearUnitsSpec(_AlgorithmSpecBase):
    """Make each transformer feed-forward block a gated linear unit: down(act(gate(x)) * up(x))."""

    name: Literal["gated_linear_units"]
    act_fn: Literal["gelu", "relu", "silu", "sigmoid", "tanh"] | None = Field(
        None, description="activation of the gate (gelu: GEGLU, silu: SwiGLU, sigmoid: GLU); null: the block's own")
    gated_layer_bias: bool = Field(False, description="give the new gate projection a bias")
    non_gated_layer_bias: bool = Field(False, description="keep (or add) a bias on the up projection")


class GyroDropoutSpec(_AlgorithmSpecBase):
    """Replace dropout with a fixed set of sigma pre-selected masks, tau of them trained at a time."""

    name: Literal["gyro_dropout"]
    p: float = Field(0.5, ge=0.0, lt=1.0, description="drop probability of every replaced dropout layer")
    sigma: int = Field(256, ge=1, le=65536, description="pre-selected subnetworks (masks) per layer")
    tau: int = Field(16, ge=1, le=65536, description="subnetworks trained at a time (the batch splits into tau groups)")

    @model_validator(mode="after")
    def _tau_within_sigma(self) -> "GyroDropoutSpec":
        if self.tau > self.sigma:
            raise ValueError(f"gyro_dropout: tau {self.tau} exceeds sigma {self.sigma}; "
                             "tau of the sigma subnetworks are active at a time")
        return self


AlgorithmSpec = Annotated[
    Union[ChannelsLastSpec, LabelSmoothingSpec, CutMixSpec, AlibiSpec, BlurPoolSpec, FactorizeSpec,
          MixUpSpec, CutOutSpec, ColOutSpec, AugMixSpec, ProgressiveResizingSpec, EMASpec, SWASpec,
          GradientClippingSpec, LayerFreezingSpec, StochasticDepthSpec, SqueezeExciteSpec,
          GhostBatchNormSpec, WeightStandardizationSpec, SAMSpec, LowPrecisionLayerNormSpec,
          LowPrecisionGroupNormSpec, FusedLayerNormSpec, SeqLengthWarmupSpec, SelectiveBackpropSpec,
          RandAugmentSpec, GatedLinearUnitsSpec, GyroDropoutSpec],
    Field(discriminator="name"),
]

ALGORITHM_SPECS: dict[str, type[BaseModel]] = {
    spec.model_fields["name"].annotation.__args__[0]: spec  # type: ignore[union-attr]
    for spec in (ChannelsLastSpec, LabelSmoothingSpec, CutMixSpec, AlibiSpec, BlurPoolSpec, FactorizeSpec,
                 MixUpSpec, CutOutSpec, ColOutSpec, AugMixSpec, ProgressiveResizingSpec, EMASpec, SWASpec,
                 GradientClippingSpec, LayerFreezingSpec, StochasticDepthSpec, SqueezeExciteSpec,
                 GhostBatchNormSpec, WeightStandardizationSpec, SAMSpec, LowPrecisionLayerNormSpec,
                 LowPrecisionGroupNormSpec, FusedLayerNormSpec, SeqLengthWarmupSpec, SelectiveBackpropSpec,
                 RandAugmentSpec, GatedLinearUnitsSpec, GyroDropoutSpec)
}


def surgery_identity(spec: BaseModel | dict[str, Any]) -> dict[str, Any]:
    """What of a surgery method's spec its checkpoint tensors depend on: the spec with every
    default filled in, as JSON, less its ``not_in_fingerprint`` fields (how new tensors start).

    The one comparison for checkpoint fingerprints (``workers.checkpoint.contents``) and fork
    checks (``api.lineage``): a spec stored before a field existed (a parent's factorize without
    ``init``) then equals one with the field's default, and a change of ``init`` alone still
    loads. A stored dict that no longer validates (a method's field since removed) is compared as
    stored, less the same fields."""
    if isinstance(spec, dict):
        model = ALGORITHM_SPECS.get(spec.get("name"))
        if model is None:
            return dict(spec)
        try:
            spec = model.model_validate(spec)
        except ValueError:
            return {k: v for k, v in spec.items() if k not in model.not_in_fingerprint}  # type: ignore[attr-defined]
    return spec.model_dump(mode="json", exclude=set(getattr(spec, "not_in_fingerprint", ())) or None)
