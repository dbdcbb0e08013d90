"""A small GPT (decoder-only transformer) for character-level language modelling.

nanoGPT-shaped: token + learned position embeddings, pre-LayerNorm blocks of causal
self-attention and a 4x GELU MLP, a final LayerNorm and an untied output head. ``forward``
maps token ids ``(B, T)`` to logits ``(B, T, vocab_size)``.

The attention is our own module so that methods can change it: ``attention_bias`` is the hook
ALiBi overrides. This module registers gpt_small's ALiBi policies (position embeddings zeroed,
frozen and extended; attention given per-head linear biases) in ``algorithms.alibi``'s registry,
the same way a user would register their own model's.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from algorithms.alibi import alibi_bias, alibi_slopes, register_alibi_policy, zero_freeze_and_extend


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with fused q/k/v projection."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0):
        super().__init__()
        if d_model % n_head:
            raise ValueError(f"d_model {d_model} must be divisible by n_head {n_head}")
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def attention_bias(self, seq_len: int, device: torch.device) -> torch.Tensor | None:
        """An additive ``(H, T, T)`` bias including the causal mask, or None for plain causal attention."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq_len, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        bias = self.attention_bias(seq_len, x.device)
        dropout = self.dropout if self.training else 0.0
        if bias is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout)
        return self.proj(y.transpose(1, 2).reshape(batch, seq_len, width))


class AlibiCausalSelfAttention(CausalSelfAttention):
    """Causal self-attention whose scores get ``-slope_h * distance`` (ALiBi), sharing the
    projections of the module it replaces (same parameters, same state-dict keys)."""

    def __init__(self, attention: CausalSelfAttention, max_sequence_length: int):
        nn.Module.__init__(self)
        self.n_head, self.dropout = attention.n_head, attention.dropout
        self.qkv, self.proj = attention.qkv, attention.proj
        self.max_sequence_length = max_sequence_length
        # Not persistent: derived from n_head, so checkpoints stay free of it.
        self.register_buffer("slopes", torch.tensor(alibi_slopes(self.n_head), device=self.qkv.weight.device),
                             persistent=False)

    def attention_bias(self, seq_len: int, device: torch.device) -> torch.Tensor:
        if seq_len > self.max_sequence_length:
            raise ValueError(f"sequence of {seq_len} tokens exceeds ALiBi's max_sequence_length "
                             f"{self.max_sequence_length}")
        return alibi_bias(self.slopes, seq_len, causal=True)


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer language model: ids ``(B, T)`` -> logits ``(B, T, vocab_size)``."""

    def __init__(self, *, vocab_size: int, n_layer: int = 4, n_head: int = 4, d_model: int = 128,
                 max_seq_len: int = 256, dropout: float = 0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        # GPT-2's init: N(0, 0.02), residual output projections scaled down by depth.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    @property
    def max_seq_len(self) -> int:
        return self.wpe.num_embeddings

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        seq_len = idx.shape[1]
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence of {seq_len} tokens exceeds the model's max_seq_len {self.max_seq_len}")
        position = torch.arange(seq_len, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(position))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@register_alibi_policy(GPT)
def _alibi_position_embeddings(model: nn.Module, max_sequence_length: int) -> nn.Module:
    model.wpe = zero_freeze_and_extend(model.wpe, max_sequence_length)
    return model


@register_alibi_policy(CausalSelfAttention)
def _alibi_attention(attention: nn.Module, max_sequence_length: int) -> nn.Module:
    return AlibiCausalSelfAttention(attention, max_sequence_length)


def gpt_small(num_classes: int, n_layer: int = 4, n_head: int = 4, d_model: int = 128, max_seq_len: int = 256,
              dropout: float = 0.0) -> GPT:
    """The small GPT; ``num_classes`` is the data set's vocabulary size (~0.8M params at the defaults)."""
    return GPT(vocab_size=num_classes, n_layer=n_layer, n_head=n_head, d_model=d_model, max_seq_len=max_seq_len,
               dropout=dropout)
