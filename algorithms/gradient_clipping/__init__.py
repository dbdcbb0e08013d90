"""GradientClipping: clip gradients by global norm, by value, or adaptively (AGC). Method card: api/method_cards/gradient_clipping.md."""

from algorithms.gradient_clipping.gradient_clipping import GradientClipping, apply_gradient_clipping

__all__ = ["GradientClipping", "apply_gradient_clipping"]
