"""The functional form of every method: torch-only functions usable in any PyTorch loop.

    import algorithms.functional as af
    model = af.apply_channels_last(model)
    x, y_perm, area, _ = af.cutmix_batch(x, y, alpha=1.0)
    y = af.smooth_labels(logits, af.mix_targets(y, y_perm, area, num_classes=10), smoothing=0.1)
"""

from algorithms.channels_last import apply_channels_last
from algorithms.cutmix import cutmix_batch, mix_targets
from algorithms.label_smoothing import smooth_labels
from algorithms.targets import to_dense_targets

__all__ = ["apply_channels_last", "cutmix_batch", "mix_targets", "smooth_labels", "to_dense_targets"]
