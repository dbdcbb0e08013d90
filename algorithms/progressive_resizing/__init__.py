"""ProgressiveResizing: small images early, full size at the end. See README.md."""

from algorithms.progressive_resizing.progressive_resizing import (ProgressiveResizing, resize_batch,
                                                                  scale_at)

__all__ = ["ProgressiveResizing", "resize_batch", "scale_at"]
