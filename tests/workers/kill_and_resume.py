"""One Ray run uninterrupted, then again with a worker SIGKILLed at a batch, or at each of
several (the test ``FaultInjection`` hook), so a test (or ``bench/faults.py``) compares the runs'
final checkpoints bitwise. ``run_plain`` once, then ``run_killed`` at as many points as wanted:
a run each, or several points in one run (a worker-group restart each, no new Ray Train run)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tests.workers.checkpoint_helpers import assert_bitwise_equal
from tests.workers.test_ray_training import TOKEN, RecordingService
from workers.fault_injection import KILL_AT_ENV, KILL_DURING_ENV, KILL_MARKER_ENV, killed_at
from workers.paths import run_url
from workers.ray_train import fit_with_ray


@dataclass
class KilledRun:
    storage_url: str
    plain_id: str
    killed_id: str
    metrics: dict[str, Any]  # the killed run's final metrics
    service: RecordingService  # what the killed run reported
    kills: list[tuple[int, int]]  # (batch, pid of the killed worker) of each kill, in order

    def assert_final_checkpoints_bitwise_equal(self, final: str) -> int:
        """``final``: the checkpoint folder, e.g. ``checkpoints/ep2-ba8``; returns tensors compared."""
        return assert_bitwise_equal(f"{run_url(self.storage_url, self.plain_id)}/{final}",
                                    f"{run_url(self.storage_url, self.killed_id)}/{final}")


def run_plain(spec, *, storage_url: str, ray_dir) -> str:
    """Train ``spec`` uninterrupted; returns its run id."""
    plain_id = f"plain-{uuid.uuid4().hex[:6]}"
    fit_with_ray(spec, run_id=plain_id, storage_path=str(ray_dir), storage_url=storage_url)
    return plain_id


def run_killed(spec, *, storage_url: str, ray_dir, marker, plain_id: str, kill_at_batch: int | Sequence[int],
               during: str = "batch") -> KilledRun:
    """Train ``spec`` with the last worker SIGKILLed at ``kill_at_batch``, or once at each batch
    of a list (``spec.max_restarts`` must allow as many restarts), reporting to a recording
    service. ``during``: ``batch``, ``eval`` or ``save``, see ``workers.fault_injection``."""
    points = [kill_at_batch] if isinstance(kill_at_batch, int) else list(kill_at_batch)
    killed_id = f"killed-{uuid.uuid4().hex[:6]}"
    saved = {name: os.environ.get(name) for name in (KILL_AT_ENV, KILL_MARKER_ENV, KILL_DURING_ENV)}
    os.environ.update({KILL_AT_ENV: ",".join(map(str, points)), KILL_MARKER_ENV: str(marker),
                       KILL_DURING_ENV: during})
    try:
        with RecordingService() as service:
            metrics = fit_with_ray(spec, run_id=killed_id, service_url=service.url, token=TOKEN,
                                   storage_path=str(ray_dir), storage_url=storage_url)
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
    kills = killed_at(marker)
    assert sorted(batch for batch, _ in kills) == sorted(points), f"killed at {kills}, asked for {points}"
    return KilledRun(storage_url, plain_id, killed_id, metrics, service, kills)


def run_plain_then_killed(spec, *, storage_url: str, tmp_path, monkeypatch, kill_at_batch: int) -> KilledRun:
    plain_id = run_plain(spec, storage_url=storage_url, ray_dir=tmp_path / "ray")
    return run_killed(spec, storage_url=storage_url, ray_dir=tmp_path / "ray", marker=tmp_path / "killed",
                      plain_id=plain_id, kill_at_batch=kill_at_batch)
