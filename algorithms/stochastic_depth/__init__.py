"""StochasticDepth: randomly skip residual blocks (or drop samples in them) while training.
Method card: api/method_cards/stochastic_depth.md."""

from algorithms.stochastic_depth.stochastic_depth import (RESIDUAL_BLOCKS, ResidualBlock, StochasticDepth,
                                                          StochasticResidual, apply_stochastic_depth,
                                                          register_residual_block)

__all__ = ["RESIDUAL_BLOCKS", "ResidualBlock", "StochasticDepth", "StochasticResidual", "apply_stochastic_depth",
           "register_residual_block"]
