"""SWA: average late-training weights, then recompute BatchNorm statistics. Method card: api/method_cards/swa.md."""

from algorithms.swa.swa import SWA, recompute_bn_stats, update_swa

__all__ = ["SWA", "recompute_bn_stats", "update_swa"]
