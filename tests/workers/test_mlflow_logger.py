"""The mlflow logger against a real MLflow tracking server (SQLite backend, started here):
params, tags and every metric read back with MLflow's own client. And how a run ends, read back
from a real MLflow store (an SQLite file, no server): FINISHED when training ends, FAILED when
it raises, KILLED when it is interrupted or stopped, both in ``tessera train``'s in-process run
(``train_local``) and in rank 0 of a Ray run (``train_rank``, here called in this process as a
sweep trial's actor does), through the one ``closed_at_end``; a sweep trial that Tune stops is
left RUNNING for the sweep's driver, whose end (``end_running_mlflow_runs``) makes it FINISHED.
And what the job driver does when its Ray job is stopped (the service canceled the run): the
run's MLflow runs still RUNNING end KILLED (``end_interrupted_mlflow_runs``, the same function),
in bounded time."""

from __future__ import annotations

import itertools
import os
import signal
import time

import httpx
import pytest
import torch

from api.views import RunStatus
from workers.checkpoint import IncompatibleCheckpoint
from workers.local import train_local
from workers.launch import mlflow_end_budget_s
from workers.loggers import (RUN_ID_TAG, STATUS_TAG, SWEEP_ID_TAG, TRIAL_ID_TAG, MLflowSink,
                             end_interrupted_mlflow_runs, end_running_mlflow_runs, flatten, prepare_mlflow_end,
                             with_loggers)
from workers.ray_train import train_rank, worker_config
from workers.reporter import MemorySink
from workers.trainer import train
from tests.local_ray import free_port
from tests.workers.helpers_specs import tiny_spec
from tests.workers.test_ray_training import TOKEN, RecordingService


def test_metrics_params_and_tags_reach_the_tracking_server(mlflow_server):
    from mlflow.tracking import MlflowClient

    spec = tiny_spec(eval_interval="1ba", tags=["baseline"],
                     loggers=[{"name": "mlflow", "tracking_uri": mlflow_server, "experiment": "logger-params"}])
    memory = MemorySink()
    sink = with_loggers(memory, spec, None, run_id="run-abc")
    train(spec, sink=sink)
    sink.status(RunStatus.COMPLETED)
    sink.close()

    client = MlflowClient(tracking_uri=mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("logger-params").experiment_id])
    assert run.data.tags["tessera.run_id"] == "run-abc" and run.data.tags["tag.baseline"] == "true"
    assert run.info.status == "FINISHED"
    assert run.data.params["optimizer.lr"] == flatten(spec.model_dump(mode="json"))["optimizer.lr"]
    for key in ("eval/accuracy", "eval/loss"):
        history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert sorted(history) == memory.values(key)


# --- how the MLflow run ends -------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """An MLflow tracking store in an SQLite file (created once: its migrations take seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def ended_spec(store: str, experiment: str, **overrides):
    body = dict(name="ends", eval_interval="1ba",
                loggers=[{"name": "mlflow", "tracking_uri": store, "experiment": experiment}])
    return tiny_spec(**(body | overrides))


def train_in_process(spec, storage, *, sink=None, on_eval=None):
    """``tessera train`` of a one-worker spec: this process trains."""
    assert on_eval is None
    return train_local(spec, sink=sink or MemorySink(), checkpoint_dir=str(storage))


ATTEMPTS = itertools.count(1)  # a new job attempt per call: not reported as a restart of the last


def train_as_rank_0(spec, storage, *, sink=None, on_eval=None, trial=None):
    """Rank 0 of a run under Ray (a Ray Train worker, a sweep trial's actor), without a service."""
    assert sink is None
    config = worker_config(spec, run_id=spec.name, storage_url=f"file://{storage}", attempt=next(ATTEMPTS),
                           tune=trial is not None, trial=trial)
    return train_rank(config, rank=0, world_size=1, device_for=lambda use_gpu: torch.device("cpu"),
                      on_eval=on_eval, entered=time.time())


PATHS = [pytest.param(train_in_process, id="tessera-train"), pytest.param(train_as_rank_0, id="ray-rank-0")]


def mlflow_runs(store: str, experiment: str) -> list:
    """The experiment's runs, oldest first."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment}"
    return sorted(client.search_runs([found.experiment_id]), key=lambda run: run.info.start_time)


@pytest.mark.parametrize("fit", PATHS)
def test_the_mlflow_run_finishes_when_training_ends_and_fails_when_it_raises(fit, mlflow_store, tmp_path):
    experiment = f"ends-{fit.__name__}"
    spec = ended_spec(mlflow_store, experiment)
    metrics = fit(spec, tmp_path)
    [finished] = mlflow_runs(mlflow_store, experiment)
    assert finished.info.status == "FINISHED"
    assert finished.data.metrics["eval/accuracy"] == pytest.approx(metrics["eval/accuracy"])

    # The same name with another model: its checkpoint is refused as training starts (fit raises).
    other = ended_spec(mlflow_store, experiment, model={"name": "simple_cnn", "params": {"width": 16, "hidden": 16}})
    with pytest.raises(IncompatibleCheckpoint):
        fit(other, tmp_path)
    [_, failed] = mlflow_runs(mlflow_store, experiment)
    assert failed.info.status == "FAILED"


class InterruptedAt(MemorySink):
    """``tessera train``'s console, with Ctrl-C pressed as step ``step`` is reported."""

    def __init__(self, step: int):
        super().__init__()
        self.step = step

    def add(self, step: int, key: str, value: float) -> None:
        if step == self.step:
            raise KeyboardInterrupt
        super().add(step, key, value)


def test_the_mlflow_run_is_killed_when_tessera_train_is_interrupted(mlflow_store, tmp_path):
    spec = ended_spec(mlflow_store, "interrupted", max_duration="4ba")
    console = InterruptedAt(2)
    with pytest.raises(KeyboardInterrupt):
        train_in_process(spec, tmp_path, sink=console)
    [run] = mlflow_runs(mlflow_store, "interrupted")
    assert run.info.status == "KILLED" and console.closed
    assert [step for step, _ in console.values("train/loss")] == [1]


def tune_stops_it(results):
    """What ``ray.tune.report`` raises in a trial that Tune stops (its scheduler, a cancel)."""
    raise SystemExit(0)


def test_a_stopped_sweep_trial_leaves_its_mlflow_run_to_the_driver_which_ends_it_finished(mlflow_store, tmp_path):
    spec = ended_spec(mlflow_store, "stopped", max_duration="4ba")
    with pytest.raises(SystemExit):
        train_as_rank_0(spec, tmp_path, on_eval=tune_stops_it, trial={"sweep_id": "sweep-1", "trial_id": "t-1"})
    [run] = mlflow_runs(mlflow_store, "stopped")
    # Rank 0 cannot tell the scheduler's stop from a canceled sweep's: it leaves the run RUNNING,
    # with what it had logged (the evaluation Tune stopped it at), tagged for the driver.
    assert run.info.status == "RUNNING" and "eval/accuracy" in run.data.metrics
    assert run.data.tags[SWEEP_ID_TAG] == "sweep-1" and run.data.tags[TRIAL_ID_TAG] == "t-1"

    # The sweep's driver, told by Tune that its scheduler stopped the trial, ends it: FINISHED, STOPPED.
    other_trial = MLflowSink(spec, mlflow_store, "stopped", run_id="r-2",
                             trial={"sweep_id": "sweep-1", "trial_id": "t-2"})
    ended = end_running_mlflow_runs(spec, {SWEEP_ID_TAG: "sweep-1", TRIAL_ID_TAG: "t-1"}, RunStatus.STOPPED,
                                    timeout_s=60)
    assert ended == [run.info.run_id]
    [stopped, _] = mlflow_runs(mlflow_store, "stopped")
    assert stopped.info.status == "FINISHED" and stopped.data.tags[STATUS_TAG] == "STOPPED"
    assert status_of(mlflow_store, other_trial.run_id) == "RUNNING"  # another trial's: not this end's


def test_outside_a_sweep_a_stop_ends_the_mlflow_run_killed(mlflow_store, tmp_path):
    with pytest.raises(SystemExit):
        train_as_rank_0(ended_spec(mlflow_store, "exited", max_duration="4ba"), tmp_path, on_eval=tune_stops_it)
    [run] = mlflow_runs(mlflow_store, "exited")
    assert run.info.status == "KILLED"


def test_rank_0_leaves_an_mlflow_run_that_the_driver_already_ended_as_it_ended(mlflow_store):
    # A canceled sweep's driver ends its trials' runs KILLED as it stops; a trial that reaches its
    # end in the moments before its actor dies does not make its run FINISHED after that.
    spec = stopped_spec(mlflow_store, "ended-first")
    rank_0 = MLflowSink(spec, mlflow_store, "ended-first", run_id="r-1", trial={"sweep_id": "s-1", "trial_id": "t-1"})
    assert end_running_mlflow_runs(spec, {SWEEP_ID_TAG: "s-1"}, RunStatus.CANCELED, timeout_s=60) == [rank_0.run_id]
    rank_0.add(1, "loss", 0.5)
    rank_0.status(RunStatus.COMPLETED)
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=mlflow_store).get_run(rank_0.run_id)
    assert run.info.status == "KILLED" and run.data.tags[STATUS_TAG] == "CANCELED"
    assert run.data.metrics["loss"] == 0.5  # its last metrics still land


def test_a_later_start_of_a_service_run_ends_failed_the_mlflow_runs_an_earlier_one_left_running(mlflow_store):
    # Rank 0 SIGKILLed (or its node lost) never ends its MLflow run. The run's next start does:
    # the service's next attempt as it starts, a restarted worker group when it says RESTARTING.
    spec = stopped_spec(mlflow_store, "superseded")

    def sink(run_id, **kwargs):
        return MLflowSink(spec, mlflow_store, "superseded", run_id=run_id, service_run=True, **kwargs)

    killed, other_run = sink("run-a"), sink("run-b")
    second_attempt = sink("run-a", attempt=2)
    assert status_of(mlflow_store, killed.run_id) == "FAILED"
    from mlflow.tracking import MlflowClient

    assert MlflowClient(tracking_uri=mlflow_store).get_run(killed.run_id).data.tags[STATUS_TAG] == "FAILED"
    assert status_of(mlflow_store, second_attempt.run_id) == "RUNNING"
    # Within the first attempt, a restarted worker group's rank 0 learns it is one after it starts.
    first_group, restarted_group = sink("run-c"), sink("run-c")
    assert status_of(mlflow_store, first_group.run_id) == "RUNNING"
    restarted_group.status(RunStatus.RESTARTING, message="Ray Train restarted the worker group")
    assert status_of(mlflow_store, first_group.run_id) == "FAILED"
    assert status_of(mlflow_store, restarted_group.run_id) == "RUNNING"
    assert status_of(mlflow_store, second_attempt.run_id) == "RUNNING"  # another Tessera run's
    assert status_of(mlflow_store, other_run.run_id) == "RUNNING"
    # A run named by its spec (tessera train) ends nothing: another live run may share the name.
    local, local_again = (MLflowSink(spec, mlflow_store, "superseded", run_id="spec-name", attempt=a) for a in (1, 2))
    local_again.status(RunStatus.RESTARTING)
    assert status_of(mlflow_store, local.run_id) == "RUNNING"


def test_ending_what_earlier_starts_left_running_waits_a_bounded_time_on_an_unreachable_server():
    # A sink as built (bypassing __init__, which needs the server), whose server then went away:
    # MLflow's client retries a refused connection for minutes; rank 0 waits timeout_s.
    sink = MLflowSink.__new__(MLflowSink)
    sink.tracking_uri, sink.experiment, sink.tessera_run_id, sink.run_id = "http://127.0.0.1:9", "x", "run-a", "m"
    started = time.monotonic()
    thread = sink.end_left_running(timeout_s=0.5)
    assert time.monotonic() - started < 5 and thread.daemon  # left to the retries, or to the process's end


def test_rank_0_of_a_restarted_group_or_a_later_attempt_ends_what_a_killed_rank_0_left_running(mlflow_store,
                                                                                               tmp_path):
    spec = ended_spec(mlflow_store, "restarts", name="restarts")

    def start(attempt):  # rank 0 of a service's run under Ray, in this process, reporting to a recording service
        with RecordingService() as service:
            config = worker_config(spec, run_id=spec.name, storage_url=f"file://{tmp_path}", attempt=attempt,
                                   service_url=service.url, token=TOKEN)
            train_rank(config, rank=0, world_size=1, device_for=lambda use_gpu: torch.device("cpu"), on_eval=None,
                       entered=time.time())

    killed = MLflowSink(spec, mlflow_store, "restarts", run_id=spec.name)  # a rank 0 SIGKILLed in attempt 1
    start(1)  # attempt 1's first start (in a real run it would be the killed one): nothing to end
    assert status_of(mlflow_store, killed.run_id) == "RUNNING"
    start(1)  # attempt 1 again: Ray Train restarted the worker group, and rank 0 says RESTARTING
    assert status_of(mlflow_store, killed.run_id) == "FAILED"
    killed_again = MLflowSink(spec, mlflow_store, "restarts", run_id=spec.name)
    start(2)  # the service's next attempt
    assert status_of(mlflow_store, killed_again.run_id) == "FAILED"
    assert [run.info.status for run in mlflow_runs(mlflow_store, "restarts")] == \
        ["FAILED", "FINISHED", "FINISHED", "FAILED", "FINISHED"]


@pytest.mark.integration
def test_rank_0_in_a_ray_train_worker_ends_the_mlflow_run(ray_client, mlflow_store, tmp_path):
    """The same through real Ray Train workers: a DDP ``tessera train`` (``fit_with_ray``, as a
    run's Ray job trains)."""
    ddp = {"parallelism": {"strategy": "ddp", "num_workers": 2}}
    train_local(ended_spec(mlflow_store, "ddp", **ddp), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    other = ended_spec(mlflow_store, "ddp", model={"name": "simple_cnn", "params": {"width": 16, "hidden": 16}}, **ddp)
    with pytest.raises(Exception, match="IncompatibleCheckpoint"):
        train_local(other, sink=MemorySink(), checkpoint_dir=str(tmp_path))
    assert [run.info.status for run in mlflow_runs(mlflow_store, "ddp")] == ["FINISHED", "FAILED"]


# --- a stopped job's driver ends the MLflow runs its killed rank 0 left RUNNING ---------------------

def stopped_spec(store: str, experiment: str):
    return tiny_spec(name="stopped-job", loggers=[{"name": "mlflow", "tracking_uri": store, "experiment": experiment}])


def status_of(store: str, mlflow_run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=store).get_run(mlflow_run_id).info.status


def test_a_stopped_driver_ends_its_runs_running_mlflow_runs_as_killed(mlflow_store):
    spec = stopped_spec(mlflow_store, "driver-stopped")
    # What rank 0 leaves when it is killed mid-attempt: its MLflowSink's run, never ended; and one
    # an earlier attempt's killed worker group left. Another Tessera run's live MLflow run too.
    killed_rank_0 = MLflowSink(spec, mlflow_store, "driver-stopped", run_id="run-stop")
    earlier_group = MLflowSink(spec, mlflow_store, "driver-stopped", run_id="run-stop")
    other_run = MLflowSink(spec, mlflow_store, "driver-stopped", run_id="run-other")
    assert status_of(mlflow_store, killed_rank_0.run_id) == "RUNNING"

    prepared = prepare_mlflow_end(spec)  # as the driver does when the attempt starts
    prepared.join(60)
    assert not prepared.is_alive() and status_of(mlflow_store, killed_rank_0.run_id) == "RUNNING"
    ended = end_interrupted_mlflow_runs(spec, "run-stop", timeout_s=60)
    assert sorted(ended) == sorted([killed_rank_0.run_id, earlier_group.run_id])
    assert status_of(mlflow_store, killed_rank_0.run_id) == "KILLED"
    assert status_of(mlflow_store, earlier_group.run_id) == "KILLED"
    assert status_of(mlflow_store, other_run.run_id) == "RUNNING"


def test_a_stopped_driver_leaves_mlflow_runs_that_ended_as_they_ended(mlflow_store):
    spec = stopped_spec(mlflow_store, "driver-ended")
    finished = MLflowSink(spec, mlflow_store, "driver-ended", run_id="run-ended")
    finished.status(RunStatus.COMPLETED)  # what closed_at_end sends when rank 0 trained to its end
    failed = MLflowSink(spec, mlflow_store, "driver-ended", run_id="run-ended")
    failed.status(RunStatus.FAILED, error="ValueError: boom")

    assert end_interrupted_mlflow_runs(spec, "run-ended", timeout_s=60) == []
    assert status_of(mlflow_store, finished.run_id) == "FINISHED"
    assert status_of(mlflow_store, failed.run_id) == "FAILED"


def test_a_stopped_driver_gives_up_on_an_unreachable_tracking_server_in_time_without_raising():
    port = free_port()  # a port nothing listens on: MLflow's client retries for minutes
    spec = stopped_spec(f"http://127.0.0.1:{port}", "unreachable")
    started = time.monotonic()
    assert prepare_mlflow_end(spec).daemon  # retries in the background, never in the driver's way
    assert end_interrupted_mlflow_runs(spec, "run-x", timeout_s=0.5) is None
    assert time.monotonic() - started < 3
    # Without an MLflow logger there is nothing to prepare or end, and no time is spent.
    tensorboard_only = tiny_spec(loggers=[{"name": "tensorboard"}])
    assert prepare_mlflow_end(tensorboard_only) is None
    assert end_interrupted_mlflow_runs(tensorboard_only, "run-x", timeout_s=0.5) == []


def test_the_driver_spends_rays_stop_grace_less_a_second_on_mlflow(monkeypatch):
    monkeypatch.delenv("RAY_JOB_STOP_WAIT_TIME_S", raising=False)
    assert mlflow_end_budget_s() == 2.0  # Ray's default grace: 3 s
    monkeypatch.setenv("RAY_JOB_STOP_WAIT_TIME_S", "30")
    assert mlflow_end_budget_s() == 10.0
    monkeypatch.setenv("RAY_JOB_STOP_WAIT_TIME_S", "1")
    assert mlflow_end_budget_s() == 0.5


def test_a_driver_whose_training_failed_ends_what_a_killed_rank_0_left_running_before_it_reports(
        mlflow_store, monkeypatch):
    """The worker group failed for good (Ray Train gave up): its rank 0 was SIGKILLed, say out of
    memory, and left its MLflow run RUNNING; the job's driver ends it FAILED, then reports the
    failure. Another Tessera run's live MLflow run is left alone."""
    import httpx
    import ray

    import workers.ray_train
    from api.client import Client
    from workers.errors import TrainingError
    from workers.launch import run_attempt

    spec = stopped_spec(mlflow_store, "driver-failed")
    killed_rank_0 = MLflowSink(spec, mlflow_store, "driver-failed", run_id="run-fails")
    other_run = MLflowSink(spec, mlflow_store, "driver-failed", run_id="run-lives")
    statuses_at_report = []

    def service(request):
        if request.method == "GET":
            return httpx.Response(200, json={"id": "run-fails", "name": "n", "status": "STARTING", "attempt": 1,
                                             "spec": spec.model_dump(mode="json"),
                                             "created_at": "2026-01-01T00:00:00Z"})
        statuses_at_report.append(status_of(mlflow_store, killed_rank_0.run_id))
        return httpx.Response(200, json={"id": "run-fails", "name": "n", "status": "FAILED", "attempt": 1,
                                         "spec": {}, "created_at": "2026-01-01T00:00:00Z"})

    def fit_fails(*args, **kwargs):  # what fit_with_ray raises once Ray Train gave up on the group
        raise TrainingError("ActorDiedError: the worker died unexpectedly (SIGKILL)")

    monkeypatch.setattr(workers.ray_train, "fit_with_ray", fit_fails)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray: the fit is faked above
    client = Client("http://tessera.test", transport=httpx.MockTransport(service))
    assert run_attempt("run-fails", service_url="http://tessera.test", token="tok", attempt=1,
                       storage_url=None, client=client) == 1
    assert statuses_at_report == ["FAILED"]  # ended before the service heard of the failure
    assert status_of(mlflow_store, other_run.run_id) == "RUNNING"


@pytest.mark.parametrize("stop, ended_as", [(KeyboardInterrupt(), "KILLED"), (RuntimeError("a rank died"), "FAILED")])
def test_tessera_train_of_a_ddp_spec_ends_what_its_killed_ranks_left_running(stop, ended_as, mlflow_store, tmp_path,
                                                                                monkeypatch):
    """A DDP ``tessera train`` trains in local Ray workers, which Ctrl-C (or a rank's death)
    kills with Ray before rank 0 can end its MLflow run: this process ends it."""
    import ray

    import workers.ray_train

    spec = stopped_spec(mlflow_store, f"local-ddp-{ended_as}").model_copy(
        update={"parallelism": tiny_spec(parallelism={"strategy": "ddp", "num_workers": 2}).parallelism})
    # Another tessera train of the same spec (another --checkpoint-dir), running since a minute ago.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_store)
    experiment = client.get_experiment_by_name(f"local-ddp-{ended_as}") or client.get_experiment(
        client.create_experiment(f"local-ddp-{ended_as}"))
    other = client.create_run(experiment.experiment_id, start_time=int(time.time() * 1000) - 60_000,
                              tags={RUN_ID_TAG: spec.name}).info
    left = []

    def fit_stopped(spec, *, run_id, **kwargs):  # rank 0 started its MLflow run, then the ranks were killed
        left.append(MLflowSink(spec, mlflow_store, f"local-ddp-{ended_as}", run_id=run_id))
        raise stop

    monkeypatch.setattr(workers.ray_train, "fit_with_ray", fit_stopped)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # no Ray: the fit is faked above
    with pytest.raises(type(stop)):
        train_local(spec, checkpoint_dir=str(tmp_path))
    assert status_of(mlflow_store, left[0].run_id) == ended_as
    assert status_of(mlflow_store, other.run_id) == "RUNNING"  # not this train's to end


def test_sigterm_stops_tessera_train_as_ctrl_c_does_and_only_while_it_trains(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    import workers.local
    from cli.main import app

    seen = []

    def train_local(spec, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause()  # not reached if the handler ran at once; else the signal ends it
        except KeyboardInterrupt:
            seen.append("interrupted")
            raise

    def unhandled(signum, frame):  # what catches the SIGTERM if the CLI set no handler: not pytest's death
        seen.append("not handled by the CLI")

    monkeypatch.setattr(workers.local, "train_local", train_local)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(tiny_spec().model_dump_json())
    before = signal.signal(signal.SIGTERM, unhandled)
    try:
        result = CliRunner().invoke(app, ["train", str(spec_file), "--no-checkpoints"])
        assert signal.getsignal(signal.SIGTERM) is unhandled  # the CLI's handler is gone once it returns
    finally:
        signal.signal(signal.SIGTERM, before)
    assert seen == ["interrupted"] and result.exit_code != 0


def test_tessera_train_runs_outside_the_main_thread_where_no_signal_handler_can_be_set(monkeypatch, tmp_path):
    import threading

    from typer.testing import CliRunner

    import workers.local
    from cli.main import app

    monkeypatch.setattr(workers.local, "train_local", lambda spec, **kwargs: {"train/loss": 1.0})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(tiny_spec().model_dump_json())
    results = []
    thread = threading.Thread(target=lambda: results.append(
        CliRunner().invoke(app, ["train", str(spec_file), "--no-checkpoints"])))
    thread.start()
    thread.join()
    assert results[0].exit_code == 0, results[0].output
