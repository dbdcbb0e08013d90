"""ChannelsLast: NHWC weights and activations. Method card: api/method_cards/channels_last.md."""

from algorithms.channels_last.channels_last import ChannelsLast, apply_channels_last

__all__ = ["ChannelsLast", "apply_channels_last"]
