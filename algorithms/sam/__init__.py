"""SAM: sharpness-aware minimization. Method card: api/method_cards/sam.md."""

from algorithms.sam.sam import SAM, SAMOptimizer, ascend, descend

__all__ = ["SAM", "SAMOptimizer", "ascend", "descend"]
