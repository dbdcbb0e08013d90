"""SeqLengthWarmup: train language models on short sequences first. Method card: api/method_cards/seq_length_warmup.md."""

from algorithms.seq_length_warmup.seq_length_warmup import SeqLengthWarmup, current_sequence_length, set_batch_sequence_length

__all__ = ["SeqLengthWarmup", "current_sequence_length", "set_batch_sequence_length"]
