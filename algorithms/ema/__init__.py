"""EMA: evaluate with an exponential moving average of the weights. Method card: api/method_cards/ema.md."""

from algorithms.ema.ema import EMA, compute_ema

__all__ = ["EMA", "compute_ema"]
