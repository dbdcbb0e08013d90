"""GatedLinearUnits: turn transformer feed-forward blocks into GLUs. Method card:
api/method_cards/gated_linear_units.md."""

from algorithms.gated_linear_units.gated_linear_units import (ACTIVATIONS, FFN_CONTAINERS, GatedFeedForward,
                                                              GatedLinearUnits, apply_gated_linear_units)

__all__ = ["ACTIVATIONS", "FFN_CONTAINERS", "GatedFeedForward", "GatedLinearUnits", "apply_gated_linear_units"]
