"""ALiBi: linear attention biases instead of position embeddings. Method card: api/method_cards/alibi.md."""

from algorithms.alibi.alibi import (ALIBI_POLICIES, Alibi, alibi_bias, alibi_slopes, apply_alibi,
                                    register_alibi_policy, scale_sequence_length, zero_freeze_and_extend)

__all__ = ["ALIBI_POLICIES", "Alibi", "alibi_bias", "alibi_slopes", "apply_alibi", "register_alibi_policy",
           "scale_sequence_length", "zero_freeze_and_extend"]
