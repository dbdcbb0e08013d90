"""FusedLayerNorm: NVIDIA apex's fused LayerNorm kernel. Method card: api/method_cards/fused_layernorm.md."""

from algorithms.fused_layernorm.fused_layernorm import FusedLayerNorm, apply_fused_layernorm, apex_fused_layernorm

__all__ = ["FusedLayerNorm", "apex_fused_layernorm", "apply_fused_layernorm"]
