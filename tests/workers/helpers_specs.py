"""Small RunSpecs for tests (imported by test modules in tests/workers and tests/algorithms)."""

from __future__ import annotations

from typing import Any

from api.specs import RunSpec


def tiny_spec(**overrides: Any) -> RunSpec:
    """A run that takes well under a second: 8x8 synthetic images, a narrow simple_cnn."""
    body: dict[str, Any] = {
        "name": "tiny",
        "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}},
        "data": {"train": {"name": "synthetic", "num_samples": 64, "image_size": 8, "num_classes": 4},
                 "eval": {"name": "synthetic", "split": "test", "num_samples": 32, "image_size": 8,
                          "num_classes": 4},
                 "batch_size": 16},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "max_duration": "2ba",
        "seed": 7,
    }
    body.update(overrides)
    return RunSpec.model_validate(body)


def digits_spec(**overrides: Any) -> RunSpec:
    """simple_cnn on digits (16x16), 2 epochs of 22 batches: learns in a few seconds."""
    body: dict[str, Any] = {
        "name": "digits",
        "model": {"name": "simple_cnn"},
        "data": {"train": {"name": "digits", "image_size": 16},
                 "eval": {"name": "digits", "split": "test", "image_size": 16}, "batch_size": 64},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "scheduler": {"name": "cosine", "warmup": "0.1dur"},
        "max_duration": "2ep",
        "eval_interval": "1ep",
        "parallelism": {"cpus_per_worker": 2},
    }
    body.update(overrides)
    return RunSpec.model_validate(body)


# The base RunSpec (a dict) of the sweep tests: a tiny simple_cnn on 8x8 digits, 2 epochs with an
# evaluation after each, so ASHA has a rung to decide on; a trial trains in seconds.
SWEEP_BASE: dict[str, Any] = {
    "name": "digits",
    "model": {"name": "simple_cnn", "params": {"width": 8, "hidden": 32}},
    "data": {"train": {"name": "digits", "image_size": 8},
             "eval": {"name": "digits", "split": "test", "image_size": 8}, "batch_size": 64},
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9},
    "max_duration": "2ep",
    "eval_interval": "1ep",
}
