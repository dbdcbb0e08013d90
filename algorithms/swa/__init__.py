"""SWA: average late-training weights, then recompute BatchNorm statistics. Method card: api/method_cards/swa.md."""

from algorithms.swa.swa import SWA, average_bn_stats_across_ranks, recompute_bn_stats, update_swa

__all__ = ["SWA", "average_bn_stats_across_ranks", "recompute_bn_stats", "update_swa"]
