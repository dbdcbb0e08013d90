"""Fork and continue end to end, on Ray with the service: a fork from the parent's latest
checkpoint starts from its trained weights (with a new lr), and a COMPLETED run continued to a
longer max_duration completes as attempt 2 with its steps going on from where it ended."""

from __future__ import annotations

import math

import pytest

from api.views import RunStatus
from tests.e2e.conftest import wait_for_status
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration

CHANCE_LOSS = math.log(10)  # cross-entropy of an untrained model over synthetic's 10 classes


def _steps(client, run_id: str, key: str, after: int = 0) -> list[tuple[int, float]]:
    return [(p.step, p.value) for p in client.metrics(run_id, after=after).data if p.key == key]


def test_a_fork_starts_from_the_parent_s_weights_and_a_continued_run_goes_on_as_attempt_two(service):
    client = service.client()
    spec = long_synthetic_spec("fork-parent", batches=30)
    spec["checkpoint"] = {"interval": "10ba", "keep_last": 2}
    parent = client.create_run(spec)
    parent = wait_for_status(client, parent.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=300)
    assert parent.status is RunStatus.COMPLETED, parent.error
    parent_eval = parent.summary["eval/loss"]
    assert parent_eval < 0.7 * CHANCE_LOSS  # the parent learned, so its weights are recognisable

    child = client.fork(parent.id, {"optimizer": {"lr": 0.01}, "max_duration": "1ba"}, from_="latest")
    assert child.fork.step == 30 and child.fork.load_optimizer and child.spec["optimizer"]["lr"] == 0.01
    child = wait_for_status(client, child.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=300)
    assert child.status is RunStatus.COMPLETED, child.error
    # One small step from the parent's weights: the fork's eval is the parent's, give or take that
    # step, and nowhere near an untrained model's.
    assert abs(child.summary["eval/loss"] - parent_eval) < 0.25 * (CHANCE_LOSS - parent_eval)
    assert [step for step, _ in _steps(client, child.id, "train/loss")] == [1]  # its own count, from 0
    assert [run.id for run in client.run_children(parent.id)] == [child.id]

    last_seq = client.metrics(parent.id).last_seq
    continued = client.continue_run(parent.id, "40ba")
    assert continued.status is RunStatus.QUEUED and continued.attempt == 2
    done = wait_for_status(client, parent.id, {RunStatus.COMPLETED, RunStatus.FAILED}, timeout=300)
    assert done.status is RunStatus.COMPLETED and done.attempt == 2, done.error
    assert done.spec["max_duration"] == "40ba"
    assert [step for step, _ in _steps(client, parent.id, "train/loss", after=last_seq)] == list(range(31, 41))
    events = [e.message or "" for e in client.run_events(parent.id).data if e.attempt == 2]
    assert any("max_duration 30ba → 40ba" in m for m in events) and any("resuming from" in m for m in events)
