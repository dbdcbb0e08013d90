"""Factorize: low-rank Linear and Conv2d layers. Method card: api/method_cards/factorize.md."""

from algorithms.factorize.factorize import (Factorize, FactorizedConv2d, FactorizedLinear, apply_factorization,
                                            max_rank_with_speedup)

__all__ = ["Factorize", "FactorizedConv2d", "FactorizedLinear", "apply_factorization", "max_rank_with_speedup"]
