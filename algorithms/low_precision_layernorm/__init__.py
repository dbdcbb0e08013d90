"""LowPrecisionLayerNorm: LayerNorm in the autocast dtype. Method card: api/method_cards/low_precision_layernorm.md."""

from algorithms.low_precision_layernorm.low_precision_layernorm import (LowPrecisionLayerNorm, LPLayerNorm,
                                                                        apply_low_precision_layernorm,
                                                                        low_precision_effective)

__all__ = ["LPLayerNorm", "LowPrecisionLayerNorm", "apply_low_precision_layernorm", "low_precision_effective"]
