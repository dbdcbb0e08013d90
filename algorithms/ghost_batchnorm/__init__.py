"""GhostBatchNorm: batch normalization over small ghost batches. Method card: api/method_cards/ghost_batchnorm.md."""

from algorithms.ghost_batchnorm.ghost_batchnorm import (GhostBatchNorm, GhostBatchNorm1d, GhostBatchNorm2d,
                                                        GhostBatchNorm3d, GhostBatchNormBase,
                                                        apply_ghost_batchnorm)

__all__ = ["GhostBatchNorm", "GhostBatchNorm1d", "GhostBatchNorm2d", "GhostBatchNorm3d", "GhostBatchNormBase",
           "apply_ghost_batchnorm"]
