"""LowPrecisionGroupNorm: GroupNorm in the autocast dtype. Method card: api/method_cards/low_precision_groupnorm.md."""

from algorithms.low_precision_groupnorm.low_precision_groupnorm import (LowPrecisionGroupNorm, LPGroupNorm,
                                                                        apply_low_precision_groupnorm)

__all__ = ["LPGroupNorm", "LowPrecisionGroupNorm", "apply_low_precision_groupnorm"]
