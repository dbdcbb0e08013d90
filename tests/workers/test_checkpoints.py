"""Sharded checkpoints in one process: exact resume, retention, torn writes, incompatible
specs, S3 over real HTTP (moto) with an outage during a save, and microbatch 'auto'."""

from __future__ import annotations

import json

import pytest
import torch

from tests.workers.checkpoint_helpers import assert_bitwise_equal, forget_after, latest_url
from tests.workers.helpers_specs import tiny_spec
from workers.checkpoint import MARKER, Checkpointer, IncompatibleCheckpoint, join, storage_for, with_retries
from workers.events import Event
from workers.reporter import MemorySink
from workers.trainer import Trainer, train


def spec_with_checkpoints(**overrides):
    body = dict(max_duration="3ep", deterministic=True, algorithms=[{"name": "cutmix"}],
                checkpoint={"interval": "2ba", "keep_last": 10})
    body.update(overrides)
    return tiny_spec(**body)


def test_a_resumed_run_ends_bitwise_equal_to_the_uninterrupted_run(tmp_path):
    spec = spec_with_checkpoints()
    whole, interrupted = f"file://{tmp_path}/whole", f"file://{tmp_path}/interrupted"
    train(spec, checkpoint_url=whole, sink=MemorySink())
    train(spec, checkpoint_url=interrupted, sink=MemorySink())
    forget_after(interrupted, 4)  # as if the run had died after batch 5, with batch 4 committed

    sink = MemorySink()
    with torch.random.fork_rng():
        torch.manual_seed(12345)  # the resumed run must not depend on the process's RNG
        train(spec, checkpoint_url=interrupted, sink=sink)
    assert [step for step, _ in sink.values("train/loss")] == list(range(5, 13))
    assert latest_url(whole).endswith("ep3-ba12") and latest_url(interrupted).endswith("ep3-ba12")
    assert assert_bitwise_equal(latest_url(whole), latest_url(interrupted)) > 10


def test_checkpoints_are_saved_every_interval_and_at_the_end_and_only_the_last_are_kept(tmp_path):
    spec = spec_with_checkpoints(max_duration="11ba", checkpoint={"interval": "3ba", "keep_last": 2})
    sink = MemorySink()
    train(spec, checkpoint_url=str(tmp_path), sink=sink)
    assert [c["step"] for c in sink.checkpoints] == [3, 6, 9, 11]
    assert all(c["committed"] and c["bytes"] > 0 and c["world_size"] == 1 for c in sink.checkpoints)
    assert sink.checkpoints[-1]["url"] == f"file://{tmp_path}/ep2-ba11"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep2-ba11", "ep2-ba9"]
    marker = json.loads((tmp_path / "ep2-ba11" / MARKER).read_text())
    assert marker["step"] == 11 and marker["world_size"] == 1 and marker["fingerprint"]["optimizer"] == "sgd"
    assert {"rank0.pt", "trainer.pt", ".metadata", MARKER} <= {p.name for p in (tmp_path / "ep2-ba11").iterdir()}


def test_a_checkpoint_without_its_commit_marker_is_never_loaded_and_is_cleaned_up(tmp_path):
    spec = spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2})
    url = f"file://{tmp_path}"
    train(spec, checkpoint_url=url, sink=MemorySink())
    (tmp_path / "ep1-ba4" / MARKER).unlink()  # a torn write: rank 0 died before committing
    checkpointer = Checkpointer(url, fingerprint={})
    assert checkpointer.latest_committed().name == "ep0-ba2"

    longer = spec_with_checkpoints(max_duration="6ba", checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    train(longer, checkpoint_url=url, sink=sink)
    assert [step for step, _ in sink.values("train/loss")][0] == 3  # resumed after batch 2, not 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep1-ba4", "ep1-ba6"]
    assert (tmp_path / "ep1-ba4" / MARKER).exists()  # rewritten by the resumed run, and committed


def test_a_checkpoint_of_another_model_is_refused_with_a_clear_error(tmp_path):
    train(spec_with_checkpoints(max_duration="2ba"), checkpoint_url=str(tmp_path), sink=MemorySink())
    other = spec_with_checkpoints(max_duration="4ba", model={"name": "simple_cnn", "params": {"width": 16, "hidden": 16}})
    with pytest.raises(IncompatibleCheckpoint) as info:
        train(other, checkpoint_url=str(tmp_path), sink=MemorySink())
    message = str(info.value)
    assert "incompatible run" in message and "model: checkpoint has" in message and "'width': 8" in message
    surgery = spec_with_checkpoints(max_duration="4ba", algorithms=[{"name": "cutmix"}, {"name": "channels_last"}])
    with pytest.raises(IncompatibleCheckpoint, match="surgery"):
        train(surgery, checkpoint_url=str(tmp_path), sink=MemorySink())


def test_retries_back_off_and_give_up_with_the_last_error():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert with_retries(flaky, what="x", attempts=3, first_delay_s=0.5, sleep=sleeps.append) == "ok"
    assert sleeps == [0.5, 1.0]
    with pytest.raises(ConnectionError):
        with_retries(lambda: (_ for _ in ()).throw(ConnectionError("down")), what="x", attempts=2, sleep=sleeps.append)


def test_microbatch_auto_halves_the_batch_after_an_out_of_memory_error_and_matches_the_full_batch():
    spec = tiny_spec(max_duration="3ba", microbatch_size="auto", deterministic=True)
    reference = Trainer(tiny_spec(max_duration="3ba", microbatch_size=4, deterministic=True), sink=MemorySink())
    reference.fit()

    trainer = Trainer(spec, sink=MemorySink())
    model, sizes = trainer.state.model, []
    forward = model.forward

    def forward_that_runs_out_of_memory(x):
        sizes.append(x.shape[0])
        if model.training and x.shape[0] > 4:  # evaluation is not microbatched
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return forward(x)

    model.forward = forward_that_runs_out_of_memory
    trainer.fit()
    assert sizes[:4] == [16, 8, 4, 4]  # full batch, half, quarter: then four microbatches of 4
    assert trainer.microbatches.size == 4
    for a, b in zip(reference.state.model.parameters(), trainer.state.model.parameters()):
        torch.testing.assert_close(a, b)
    with pytest.raises(torch.OutOfMemoryError):  # without 'auto' the error stands
        fixed = Trainer(tiny_spec(max_duration="1ba"), sink=MemorySink())
        fixed.state.model.forward = lambda x: (_ for _ in ()).throw(torch.OutOfMemoryError("injected"))
        fixed.fit()


@pytest.mark.integration
def test_checkpoints_round_trip_through_s3_over_http(s3_server):
    url = s3_server.url("runs/s3-roundtrip/checkpoints")
    spec = spec_with_checkpoints(max_duration="6ba", checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    train(spec, checkpoint_url=url, sink=sink)
    assert [c["url"] for c in sink.checkpoints][-1] == f"{url}/ep1-ba6"
    assert storage_for(url).listdir(url) == ["ep1-ba4", "ep1-ba6"]

    local = f"file:///tmp/tessera-s3-compare-{id(sink)}"
    storage_for(local).remove(local)
    train(spec, checkpoint_url=local, sink=MemorySink())
    assert_bitwise_equal(f"{url}/ep1-ba6", f"{local}/ep1-ba6")
    storage_for(local).remove(local)

    longer = spec_with_checkpoints(max_duration="8ba", checkpoint={"interval": "2ba", "keep_last": 2})
    resumed = MemorySink()
    train(longer, checkpoint_url=url, sink=resumed)
    assert resumed.values("train/loss")[0][0] == 7


@pytest.fixture
def s3_fails_fast(s3_server, monkeypatch):
    """One attempt per S3 request (``S3_LIMITS.attempts``, botocore's retries) for the test, on the
    S3 server. While S3 is down botocore retries each refused call with backoff, under the
    checkpointer's own retries: time per failed save that these tests would wait through but do
    not check. (``AWS_MAX_ATTEMPTS`` no longer does it: the client's config sets the attempts.)
    s3fs keeps a file system (with its client) per set of arguments and thread, so its cache is
    cleared before (a client made earlier keeps its retries) and after (later tests get them back)."""
    from dataclasses import replace

    from s3fs import S3FileSystem

    from workers import s3_limits

    monkeypatch.setattr(s3_limits, "S3_LIMITS", replace(s3_limits.S3_LIMITS, attempts=1))
    S3FileSystem.clear_instance_cache()
    yield
    S3FileSystem.clear_instance_cache()


class Outage:
    """A callback that takes the object store down after one batch and brings it back later."""

    def __init__(self, server, *, down_at: int, up_at: int):
        self.server, self.down_at, self.up_at = server, down_at, up_at

    def run_event(self, event, state):
        if event is Event.BATCH_END and state.timestamp.batch == self.down_at:
            self.server.stop()
        if event is Event.BATCH_END and state.timestamp.batch == self.up_at:
            self.server.start()


@pytest.mark.integration
@pytest.mark.usefixtures("s3_fails_fast")
def test_an_s3_outage_during_a_save_leaves_it_uncommitted_and_training_goes_on(s3_server):
    url = s3_server.url("runs/s3-outage/checkpoints")
    spec = spec_with_checkpoints(max_duration="8ba", checkpoint={"interval": "2ba", "keep_last": 3})
    sink = MemorySink()
    trainer = Trainer(spec, sink=sink, checkpoint_url=url, callbacks=[Outage(s3_server, down_at=3, up_at=5)])
    trainer.checkpointer.first_delay_s = 0.1
    try:
        trainer.fit()
    finally:
        if s3_server._server is None:
            s3_server.start()
    outcome = [(c["step"], c["committed"]) for c in sink.checkpoints]
    assert outcome == [(2, True), (4, False), (6, True), (8, True)]
    failed = sink.checkpoints[1]
    assert "Error" in failed["error"] and failed["url"] == f"{url}/ep1-ba4"
    assert [step for step, _ in sink.values("train/loss")] == list(range(1, 9))
    committed = Checkpointer(url, fingerprint={}).checkpoints()
    assert [(c.step, c.committed) for c in committed] == [(2, True), (6, True), (8, True)]  # torn ba4 removed
    assert not storage_for(url).isfile(join(url, "ep1-ba4", MARKER))


@pytest.mark.integration
@pytest.mark.usefixtures("s3_fails_fast")
def test_s3_down_through_the_final_save_reports_it_missing_and_a_resume_takes_the_newest_committed(s3_server):
    from workers.outcome import FINAL_SAVED_KEY

    url = s3_server.url("runs/s3-final-outage/checkpoints")
    spec = spec_with_checkpoints(max_duration="7ba", checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    # Down from the end of batch 7 (the final save's batch) until training has ended.
    trainer = Trainer(spec, sink=sink, checkpoint_url=url, callbacks=[Outage(s3_server, down_at=7, up_at=-1)])
    trainer.checkpointer.attempts = 1  # s3fs retries each call already
    try:
        metrics = trainer.fit()
    finally:
        s3_server.start()
    assert [(c["step"], c["committed"]) for c in sink.checkpoints] == [(2, True), (4, True), (6, True), (7, False)]
    assert metrics[FINAL_SAVED_KEY] == 0.0 and sink.values(FINAL_SAVED_KEY) == [(7, 0.0)]
    assert any("final model could not be exported" in note for note in sink.notes)  # and fit() still returned

    resumed = MemorySink()
    longer = Trainer(spec_with_checkpoints(max_duration="9ba", checkpoint={"interval": "2ba", "keep_last": 2}),
                     sink=resumed, checkpoint_url=url)
    longer.fit()
    assert longer.resumed_from == f"{url}/ep1-ba6"  # the torn ba7 is never loaded
    assert [step for step, _ in resumed.values("train/loss")] == [7, 8, 9]


def test_how_factorized_layers_start_is_left_out_of_the_fingerprint_but_their_sizes_are_not():
    from workers.checkpoint.contents import fingerprint

    def of(**factorize):
        spec = spec_with_checkpoints(algorithms=[{"name": "factorize", **factorize}])
        return fingerprint(spec, surgery=spec.algorithms, num_classes=10, in_channels=1)

    # The init is overwritten by the checkpoint's tensors on resume: runs written before the
    # field existed, or with another init, resume; another latent size (other shapes) does not.
    assert of(init="svd") == of(init="random") == of()
    assert "init" not in of()["surgery"][0] and of()["surgery"][0]["latent_features"] == 128
    assert of(latent_features=64) != of()


@pytest.mark.integration
@pytest.mark.usefixtures("s3_fails_fast")
def test_s3_down_during_retention_is_a_note_and_the_next_commit_deletes_what_it_left(s3_server):
    url = s3_server.url("runs/s3-retention-outage/checkpoints")
    spec = spec_with_checkpoints(max_duration="8ba", checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    trainer = Trainer(spec, sink=sink, checkpoint_url=url)
    retain, retentions = trainer.checkpointer.retain, []

    def retain_while_s3_is_down_the_third_time():  # step 6's retention, which would delete step 2
        retentions.append(len(retentions) + 1)
        if retentions[-1] != 3:
            return retain()
        s3_server.stop()
        try:
            return retain()
        finally:
            s3_server.start()

    trainer.checkpointer.retain = retain_while_s3_is_down_the_third_time
    trainer.fit()
    assert [(c["step"], c["committed"]) for c in sink.checkpoints] == [(2, True), (4, True), (6, True), (8, True)]
    (note,) = sink.notes
    assert "could not be deleted (keep_last=2)" in note and "the next commit tries again" in note
    assert [step for step, _ in sink.values("train/loss")] == list(range(1, 9))
    committed = Checkpointer(url, fingerprint={}).checkpoints()
    assert [(c.step, c.committed) for c in committed] == [(6, True), (8, True)]  # step 8's retention caught up


@pytest.mark.parametrize("lost", ["rank0.pt", "__0_0.distcp"])  # a rank's own file; model and optimizer data
def test_a_committed_checkpoint_that_lost_a_file_is_skipped_and_its_step_is_saved_again_whole(tmp_path, lost):
    spec = spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2})
    url = f"file://{tmp_path}"
    train(spec, checkpoint_url=url, sink=MemorySink())
    (tmp_path / "ep1-ba4" / lost).unlink()  # lost from storage after its commit
    checkpointer = Checkpointer(url, fingerprint={})
    assert checkpointer.missing_files(f"{url}/ep1-ba4", 1) == [lost]
    assert checkpointer.latest_committed().name == "ep0-ba2"

    longer = spec_with_checkpoints(max_duration="6ba", checkpoint={"interval": "2ba", "keep_last": 2})
    sink = MemorySink()
    train(longer, checkpoint_url=url, sink=sink)
    assert [step for step, _ in sink.values("train/loss")][0] == 3  # resumed after batch 2
    assert [(c["step"], c["committed"]) for c in sink.checkpoints] == [(4, True), (6, True)]
    assert any("ep1-ba4" in note and "cannot be loaded" in note for note in sink.notes)
    assert (tmp_path / "ep1-ba4" / lost).exists() and not checkpointer.missing_files(f"{url}/ep1-ba4", 1)


def test_retention_never_deletes_the_last_loadable_checkpoint_for_a_newer_one_that_lost_a_file(tmp_path):
    spec = spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2})
    train(spec, checkpoint_url=f"file://{tmp_path}", sink=MemorySink())
    (tmp_path / "ep1-ba4" / "rank0.pt").unlink()
    assert Checkpointer(f"file://{tmp_path}", fingerprint={}, keep_last=1).retain() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep0-ba2", "ep1-ba4"]


def test_retention_deletes_nothing_when_a_marker_cannot_be_read(tmp_path, monkeypatch):
    """A storage error on a committed checkpoint's marker is no missing marker: retention would
    delete that checkpoint as torn. It raises instead (a commit logs it and tries at the next)."""
    spec = spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2})
    train(spec, checkpoint_url=f"file://{tmp_path}", sink=MemorySink())
    checkpointer = Checkpointer(f"file://{tmp_path}", fingerprint={}, keep_last=2)
    info = checkpointer.storage.fs.info

    def flaky(path, **kwargs):
        if path.endswith(f"ep0-ba2/{MARKER}"):
            raise ConnectionResetError("the store dropped the connection")
        return info(path, **kwargs)

    monkeypatch.setattr(checkpointer.storage.fs, "info", flaky)
    with pytest.raises(ConnectionResetError):
        checkpointer.retain()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ep0-ba2", "ep1-ba4"]


def test_a_save_whose_file_vanishes_before_the_commit_is_not_committed(tmp_path, monkeypatch):
    write_files = Checkpointer._write_files

    def write_then_lose_trainer_state(self, url, *args):
        written = write_files(self, url, *args)
        if url.endswith("ep1-ba4"):
            storage_for(url).remove(join(url, "trainer.pt"))
        return written

    monkeypatch.setattr(Checkpointer, "_write_files", write_then_lose_trainer_state)
    sink = MemorySink()
    train(spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2}),
          checkpoint_url=f"file://{tmp_path}", sink=sink)
    outcomes = [(c["step"], c["committed"]) for c in sink.checkpoints]
    assert outcomes == [(2, True), (4, False)], outcomes
    assert "trainer.pt missing from" in sink.checkpoints[-1]["error"]
    assert not (tmp_path / "ep1-ba4" / MARKER).exists()


@pytest.mark.parametrize("garbled", [MARKER, ".metadata"])
def test_a_committed_checkpoint_whose_marker_or_metadata_no_longer_parses_counts_as_damaged(tmp_path, garbled):
    spec = spec_with_checkpoints(max_duration="4ba", checkpoint={"interval": "2ba", "keep_last": 2})
    train(spec, checkpoint_url=f"file://{tmp_path}", sink=MemorySink())
    (tmp_path / "ep1-ba4" / garbled).write_bytes(b"\x80not what was written")
    checkpointer = Checkpointer(f"file://{tmp_path}", fingerprint={}, keep_last=1)
    assert checkpointer.latest_committed().name == "ep0-ba2" and "unreadable" in checkpointer.damaged[0]
    assert checkpointer.retain() == []  # no error, and the loadable one stays
