"""Algorithm name -> class, and building algorithms from their specs.

The names are exactly the keys of ``api.catalog.ALGORITHMS`` (a test checks it), and each spec
in ``api.algorithm_specs`` carries the constructor's keyword arguments.
"""

from __future__ import annotations

from typing import Any, Iterable

from algorithms.alibi import Alibi
from algorithms.base import Algorithm
from algorithms.blurpool import BlurPool
from algorithms.channels_last import ChannelsLast
from algorithms.cutmix import CutMix
from algorithms.factorize import Factorize
from algorithms.fused_layernorm import FusedLayerNorm
from algorithms.gated_linear_units import GatedLinearUnits
from algorithms.ghost_batchnorm import GhostBatchNorm
from algorithms.gradient_clipping import GradientClipping
from algorithms.gyro_dropout import GyroDropout
from algorithms.label_smoothing import LabelSmoothing
from algorithms.layer_freezing import LayerFreezing
from algorithms.low_precision_groupnorm import LowPrecisionGroupNorm
from algorithms.low_precision_layernorm import LowPrecisionLayerNorm
from algorithms.augmix import AugMix
from algorithms.colout import ColOut
from algorithms.cutout import CutOut
from algorithms.ema import EMA
from algorithms.mixup import MixUp
from algorithms.progressive_resizing import ProgressiveResizing
from algorithms.randaugment import RandAugment
from algorithms.sam import SAM
from algorithms.selective_backprop import SelectiveBackprop
from algorithms.seq_length_warmup import SeqLengthWarmup
from algorithms.squeeze_excite import SqueezeExcite
from algorithms.stochastic_depth import StochasticDepth
from algorithms.swa import SWA
from algorithms.weight_standardization import WeightStandardization

ALGORITHM_CLASSES: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (ChannelsLast, LabelSmoothing, CutMix, Alibi, BlurPool, Factorize,
                MixUp, CutOut, ColOut, AugMix, ProgressiveResizing, EMA, SWA,
                GradientClipping, LayerFreezing, StochasticDepth, SqueezeExcite,
                GhostBatchNorm, WeightStandardization, SAM, LowPrecisionLayerNorm, LowPrecisionGroupNorm,
                FusedLayerNorm, SeqLengthWarmup, SelectiveBackprop,
                RandAugment, GatedLinearUnits, GyroDropout)
}


def build_algorithm(spec: Any) -> Algorithm:
    """One algorithm from its ``api.algorithm_specs`` spec (or a dict with a ``name``)."""
    name = spec["name"] if isinstance(spec, dict) else spec.name
    try:
        cls = ALGORITHM_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHM_CLASSES))}") from None
    if isinstance(spec, dict):
        return cls(**{k: v for k, v in spec.items() if k != "name"})
    return cls.from_spec(spec)


def build_algorithms(specs: Iterable[Any]) -> list[Algorithm]:
    """Algorithms in the order listed: that order is the engine's before-event order."""
    return [build_algorithm(spec) for spec in specs]
