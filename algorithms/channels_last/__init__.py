"""ChannelsLast: NHWC weights and activations. See README.md for the method card."""

from algorithms.channels_last.channels_last import ChannelsLast, apply_channels_last

__all__ = ["ChannelsLast", "apply_channels_last"]
