"""The trainer's parts: what a checkpoint gathers, when it saves, and test-only faults that are
installed only when asked for."""

import pytest

from workers.events import Event
from workers.fault_injection import FaultInjection, install_fault_injection, killed_at
from workers.reporter import MemorySink
from workers.state import State
from workers.timekeeping import Timestamp
from workers.trainer import Trainer

from tests.workers.helpers_specs import tiny_spec


def checkpointed_spec(max_duration="4ba"):
    return tiny_spec(max_duration=max_duration, checkpoint={"interval": "2ba", "keep_last": 5})


def test_the_train_loaders_own_state_is_saved_and_handed_back_whole_on_resume(tmp_path):
    url = f"file://{tmp_path}/checkpoints"
    first = Trainer(checkpointed_spec(max_duration="2ba"), sink=MemorySink(), checkpoint_url=url)
    loader = first.train_loader
    plain_state = loader.state_dict
    # A streaming loader's position is richer than (epoch, batch): it must come back as saved.
    loader.state_dict = lambda: {**plain_state(), "shard": "part-00003", "offset": 1234}
    first.fit()

    second = Trainer(checkpointed_spec(), sink=MemorySink(), checkpoint_url=url)
    received = []
    plain_load = second.train_loader.load_state_dict
    second.train_loader.load_state_dict = lambda state: (received.append(state), plain_load(state))
    assert second.resume() == f"{url}/ep0-ba2"
    assert received == [{"epoch": 0, "batch_in_epoch": 2, "shard": "part-00003", "offset": 1234}]
    assert second.state.timestamp.batch == 2


def test_checkpoints_are_saved_on_the_interval_and_once_at_the_end(tmp_path):
    sink = MemorySink()
    trainer = Trainer(checkpointed_spec(max_duration="5ba"), sink=sink, checkpoint_url=f"file://{tmp_path}/c")
    trainer.fit()
    assert [c["step"] for c in sink.checkpoints] == [2, 4, 5]
    trainer.checkpoints.save_final(5)  # the end is saved already
    assert len(sink.checkpoints) == 3


def test_faults_are_installed_only_when_the_environment_asks_for_one():
    trainer = Trainer(tiny_spec(), sink=MemorySink())
    install_fault_injection(trainer, environ={"TESSERA_TEST_KILL_AT_BATCH": "3"})  # no marker: no kill
    assert trainer.engine.callbacks == []
    install_fault_injection(trainer, environ={"TESSERA_TEST_BATCH_DELAY_S": "0.01"})
    (faults,) = trainer.engine.callbacks
    assert isinstance(faults, FaultInjection) and faults.delay_s == 0.01 and not faults.kill_at_batches


def test_a_kill_happens_once_on_the_chosen_rank_after_the_chosen_batch(tmp_path, monkeypatch):
    kills, waits = [], []
    monkeypatch.setattr("workers.fault_injection.os.kill", lambda pid, sig: kills.append(sig))
    marker = tmp_path / "killed"
    faults = FaultInjection.from_env({"TESSERA_TEST_KILL_AT_BATCH": "2", "TESSERA_TEST_KILL_MARKER": str(marker)},
                                     before_kill=lambda: waits.append(True))
    state = State(model=None, num_classes=2, max_batches=4, loss_fn=None, rank=1, world_size=2)
    for batch in (1, 2, 2):
        state.timestamp = Timestamp(batch=batch)
        faults.run_event(Event.BATCH_END, state)
    assert len(kills) == 1 and waits == [True] and marker.is_file()  # the marker stops a second kill
    state.rank = 0
    marker.unlink()
    faults.run_event(Event.BATCH_END, state)
    assert len(kills) == 1  # the default rank is the last one


def test_several_kill_points_kill_once_each_in_the_order_training_reaches_them(tmp_path, monkeypatch):
    kills = []
    monkeypatch.setattr("workers.fault_injection.os.kill", lambda pid, sig: kills.append(sig))
    marker = tmp_path / "killed"
    faults = FaultInjection.from_env({"TESSERA_TEST_KILL_AT_BATCH": "5,4,7", "TESSERA_TEST_KILL_MARKER": str(marker)})
    state = State(model=None, num_classes=2, max_batches=8, loss_fn=None, rank=1, world_size=2)
    # Killed at 4, resumed from 2; killed at 5, resumed from 4; killed at 7, resumed from 6.
    for batch in (1, 2, 3, 4, 3, 4, 5, 5, 6, 7, 7, 8):
        state.timestamp = Timestamp(batch=batch)
        faults.run_event(Event.BATCH_END, state)
    assert len(kills) == 3
    assert [batch for batch, _ in killed_at(marker)] == [4, 5, 7]


def test_a_kill_point_that_is_not_a_batch_number_is_refused():
    with pytest.raises(ValueError, match="TESSERA_TEST_KILL_AT_BATCH"):
        FaultInjection.from_env({"TESSERA_TEST_KILL_AT_BATCH": "4;5", "TESSERA_TEST_KILL_MARKER": "m"})
