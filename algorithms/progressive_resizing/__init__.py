"""ProgressiveResizing: small images early, full size at the end. Method card: api/method_cards/progressive_resizing.md."""

from algorithms.progressive_resizing.progressive_resizing import (ProgressiveResizing, resize_batch,
                                                                  scale_at)

__all__ = ["ProgressiveResizing", "resize_batch", "scale_at"]
