"""ColOut: drop random rows and columns of the images. Method card: api/method_cards/colout.md."""

from algorithms.colout.colout import ColOut, ColOutTransform, colout_batch

__all__ = ["ColOut", "ColOutTransform", "colout_batch"]
