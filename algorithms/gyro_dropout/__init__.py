"""GyroDropout: dropout that trains a fixed set of pre-selected subnetworks. Method card:
api/method_cards/gyro_dropout.md."""

from algorithms.gyro_dropout.gyro_dropout import GyroDropout, GyroDropoutLayer, apply_gyro_dropout

__all__ = ["GyroDropout", "GyroDropoutLayer", "apply_gyro_dropout"]
