"""The functional form of every method: torch-only functions usable in any PyTorch loop.

    import algorithms.functional as af
    model = af.apply_channels_last(model)
    x, y_perm, area, _ = af.cutmix_batch(x, y, alpha=1.0)
    y = af.smooth_labels(logits, af.mix_targets(y, y_perm, area, num_classes=10), smoothing=0.1)
"""

from algorithms.alibi import apply_alibi
from algorithms.blurpool import apply_blurpool
from algorithms.channels_last import apply_channels_last
from algorithms.cutmix import cutmix_batch, mix_targets
from algorithms.factorize import apply_factorization
from algorithms.fused_layernorm import apply_fused_layernorm
from algorithms.gated_linear_units import apply_gated_linear_units
from algorithms.ghost_batchnorm import apply_ghost_batchnorm
from algorithms.gradient_clipping import apply_gradient_clipping
from algorithms.gyro_dropout import apply_gyro_dropout
from algorithms.label_smoothing import smooth_labels
from algorithms.layer_freezing import freeze_layers
from algorithms.low_precision_groupnorm import apply_low_precision_groupnorm
from algorithms.low_precision_layernorm import apply_low_precision_layernorm
from algorithms.targets import to_dense_targets
from algorithms.augmix import augmix_image
from algorithms.colout import colout_batch
from algorithms.cutout import cutout_batch
from algorithms.ema import compute_ema
from algorithms.mixup import mixup_batch, mixup_targets
from algorithms.progressive_resizing import resize_batch
from algorithms.randaugment import randaugment_image
from algorithms.sam import SAMOptimizer
from algorithms.selective_backprop import select_using_loss, should_selective_backprop
from algorithms.seq_length_warmup import set_batch_sequence_length
from algorithms.squeeze_excite import apply_squeeze_excite
from algorithms.stochastic_depth import apply_stochastic_depth
from algorithms.swa import recompute_bn_stats, update_swa
from algorithms.weight_standardization import apply_weight_standardization

__all__ = ["apply_alibi", "apply_blurpool", "apply_channels_last", "apply_factorization", "cutmix_batch",
           "mix_targets", "smooth_labels", "to_dense_targets",
           "augmix_image", "colout_batch", "compute_ema", "cutout_batch", "mixup_batch", "mixup_targets",
           "recompute_bn_stats", "resize_batch", "update_swa",
           "apply_gradient_clipping", "freeze_layers", "apply_stochastic_depth",
           "apply_squeeze_excite", "apply_ghost_batchnorm",
           "apply_weight_standardization", "SAMOptimizer", "apply_low_precision_layernorm",
           "apply_low_precision_groupnorm", "apply_fused_layernorm",
           "set_batch_sequence_length", "select_using_loss", "should_selective_backprop",
           "randaugment_image", "apply_gated_linear_units", "apply_gyro_dropout"]
