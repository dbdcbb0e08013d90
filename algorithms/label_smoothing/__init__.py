"""LabelSmoothing: blend targets with the uniform distribution. Method card: api/method_cards/label_smoothing.md."""

from algorithms.label_smoothing.label_smoothing import LabelSmoothing, smooth_labels

__all__ = ["LabelSmoothing", "smooth_labels"]
