"""LayerFreezing: freeze the earliest layers progressively. Method card: api/method_cards/layer_freezing.md."""

from algorithms.layer_freezing.layer_freezing import LayerFreezing, freeze_layers, freeze_schedule, parameter_layers

__all__ = ["LayerFreezing", "freeze_layers", "freeze_schedule", "parameter_layers"]
