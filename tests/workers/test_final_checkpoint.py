"""A final save that fails after its retries is not hidden: the run reports
``checkpoint/final_saved`` 0 and the launcher's COMPLETED says ``final_checkpoint: missing``;
a retention that fails becomes a note (a run event), not only a log line."""

from __future__ import annotations

import json

import httpx

from api.client import Client
from tests.workers.helpers_specs import tiny_spec
from workers.events import Event
from workers.outcome import FINAL_SAVED_KEY, RunOutcome
from workers.reporter import MemorySink
from workers.trainer import Trainer


class BreakStorageAt:
    """From the end of batch ``at`` on, every write to the checkpoint folder fails; deleting
    old checkpoints fails throughout."""

    def __init__(self, trainer: Trainer, at: int):
        self.trainer, self.at = trainer, at

    def run_event(self, event, state):
        if event is Event.BATCH_END and state.timestamp.batch == self.at:
            def refuse(*_args, **_kwargs):
                raise PermissionError("read-only file system")
            self.trainer.checkpointer.storage.write_bytes = refuse


def test_a_failed_final_save_is_reported_as_a_missing_final_checkpoint(tmp_path):
    spec = tiny_spec(max_duration="7ba", deterministic=True, checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    trainer = Trainer(spec, sink=sink, checkpoint_url=f"file://{tmp_path}/checkpoints")
    trainer.checkpointer.first_delay_s = 0.01

    def no_delete(url):
        raise PermissionError(f"cannot delete {url}")
    trainer.checkpointer.storage.remove = no_delete
    trainer.engine.callbacks.append(BreakStorageAt(trainer, at=7))
    metrics = trainer.fit()

    assert [(c["step"], c["committed"]) for c in sink.checkpoints] == [(2, True), (4, True), (6, True), (7, False)]
    assert sink.values(FINAL_SAVED_KEY) == [(7, 0.0)] and metrics[FINAL_SAVED_KEY] == 0.0
    assert any("could not be deleted" in note and "keep_last=2" in note for note in sink.notes)

    sent = []
    view = {"id": "r1", "name": "n", "status": "COMPLETED", "attempt": 1, "spec": {},
            "created_at": "2026-01-01T00:00:00Z"}

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=view)
    client = Client("http://tessera.test", transport=httpx.MockTransport(service))
    assert RunOutcome(client, "r1", "token").completed(metrics)
    assert sent[0]["status"] == "COMPLETED" and sent[0]["final_checkpoint"] == "missing"
    assert sent[0]["message"].endswith("final checkpoint missing")


def test_a_run_whose_final_state_is_committed_says_saved(tmp_path):
    spec = tiny_spec(max_duration="3ba", deterministic=True, checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    metrics = Trainer(spec, sink=sink, checkpoint_url=f"file://{tmp_path}/checkpoints").fit()
    assert sink.values(FINAL_SAVED_KEY) == [(3, 1.0)] and metrics[FINAL_SAVED_KEY] == 1.0
    assert sink.notes == []


def test_a_completed_runs_message_is_its_final_evaluation_else_its_last_training_loss():
    from workers.outcome import summary_of

    assert summary_of({"eval/accuracy": 0.91234, "eval/loss": 0.3, "train/loss": 0.2}) == \
        "eval/accuracy=0.9123, eval/loss=0.3"
    assert summary_of({"train/loss": 0.4242, "lr": 0.1}) == "train/loss=0.4242"  # no eval set: not "completed"
    assert summary_of({}) == "no metrics reported"
