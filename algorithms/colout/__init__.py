"""ColOut: drop random rows and columns of the images. See README.md."""

from algorithms.colout.colout import ColOut, ColOutTransform, colout_batch

__all__ = ["ColOut", "ColOutTransform", "colout_batch"]
