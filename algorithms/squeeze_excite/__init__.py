"""SqueezeExcite: channel attention after wide convolutions. Method card: api/method_cards/squeeze_excite.md."""

from algorithms.squeeze_excite.squeeze_excite import (SqueezeExcite, SqueezeExcite2d, SqueezeExciteConv2d,
                                                      apply_squeeze_excite)

__all__ = ["SqueezeExcite", "SqueezeExcite2d", "SqueezeExciteConv2d", "apply_squeeze_excite"]
