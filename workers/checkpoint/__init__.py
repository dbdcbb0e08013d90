"""Sharded checkpoints: storage protocol, what they hold, save/commit/retain/load."""

from workers.checkpoint.contents import (IncompatibleCheckpoint, check_compatible, fingerprint, rng_state,
                                         set_rng_state, spec_hash)
from workers.checkpoint.manager import MARKER, CheckpointInfo, Checkpointer, checkpoint_name, read_checkpoint
from workers.checkpoint.reader import ParallelFsspecReader
from workers.checkpoint.storage import FsspecStorage, join, normalize_url, storage_for, with_retries

__all__ = ["MARKER", "CheckpointInfo", "Checkpointer", "FsspecStorage", "IncompatibleCheckpoint",
           "ParallelFsspecReader", "check_compatible", "checkpoint_name", "fingerprint", "join", "normalize_url",
           "read_checkpoint", "rng_state", "set_rng_state", "spec_hash", "storage_for", "with_retries"]
