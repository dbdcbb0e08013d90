"""One Ray run twice: uninterrupted, then with a worker SIGKILLed at a batch (the test
``FaultInjection`` hook), so a test compares the two runs' final checkpoints bitwise."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from tests.workers.checkpoint_helpers import assert_bitwise_equal
from tests.workers.test_ray_training import TOKEN, RecordingService
from workers.paths import run_url
from workers.ray_train import fit_with_ray


@dataclass
class KilledRun:
    storage_url: str
    plain_id: str
    killed_id: str
    metrics: dict[str, Any]  # the killed run's final metrics
    service: RecordingService  # what the killed run reported

    def assert_final_checkpoints_bitwise_equal(self, final: str) -> None:
        """``final``: the checkpoint folder, e.g. ``checkpoints/ep1-ba8``."""
        assert_bitwise_equal(f"{run_url(self.storage_url, self.plain_id)}/{final}",
                             f"{run_url(self.storage_url, self.killed_id)}/{final}")


def run_plain_then_killed(spec, *, storage_url: str, tmp_path, monkeypatch, kill_at_batch: int) -> KilledRun:
    plain_id, killed_id = f"plain-{uuid.uuid4().hex[:6]}", f"killed-{uuid.uuid4().hex[:6]}"
    fit_with_ray(spec, run_id=plain_id, storage_path=str(tmp_path / "ray"), storage_url=storage_url)

    marker = tmp_path / "killed"
    monkeypatch.setenv("TESSERA_TEST_KILL_AT_BATCH", str(kill_at_batch))
    monkeypatch.setenv("TESSERA_TEST_KILL_MARKER", str(marker))
    with RecordingService() as service:
        metrics = fit_with_ray(spec, run_id=killed_id, service_url=service.url, token=TOKEN,
                               storage_path=str(tmp_path / "ray"), storage_url=storage_url)
    assert marker.exists(), "the worker was never killed"
    return KilledRun(storage_url, plain_id, killed_id, metrics, service)
