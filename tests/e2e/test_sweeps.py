"""Sweeps end to end: the service runs the Ray Tune driver as a Ray job, trials are runs.

Real components: the service (PostgreSQL, the session's Ray head), the driver job
(``python -m workers.tune``), Tune trial actors, which train these one-worker trials themselves.
Each sweep is small (simple_cnn on 8x8 digits, one worker per trial).
"""

from __future__ import annotations

import json
import threading
import time

import psutil
import pytest

from api.errors import ApiError
from api.sweeps import SweepSpec
from api.views import RunStatus, SweepStatus
from tests.e2e.conftest import wait_until
from tests.e2e.test_vertical_slice import wait_for_warm_driver_interpreter
from tests.workers.helpers_specs import SWEEP_BASE

pytestmark = pytest.mark.integration

BASE = SWEEP_BASE
TRAIN_WORKER_ACTORS = {"TrainController", "RayTrainWorker", "ImplicitFunc"}  # ImplicitFunc: a Tune trial


def sweep_spec(name: str, params: dict, **changes) -> dict:
    return {"name": name, "base": BASE, "search": {"params": params}, **changes}


@pytest.fixture(autouse=True)
def no_sweep_left_running(service):
    """Cancel what a failed test left running: trials cannot be canceled one by one, and the
    service fixture's teardown waits for every run to end."""
    yield
    client = service.client()
    for sweep in client.list_sweeps(limit=100).data:
        if not sweep.status.is_terminal:
            try:
                client.cancel_sweep(sweep.id)
            except ApiError:
                pass
    wait_until(lambda: all(s.status.is_terminal for s in client.list_sweeps(limit=100).data), timeout=90,
               what="every sweep to end")


def by_batch_size(client, sweep_id: str) -> dict[int, object]:
    return {r.spec["data"]["batch_size"]: r for r in client.iter_runs(sweep_id=sweep_id)}


def test_a_sweep_runs_its_trials_as_runs_and_a_failing_trial_does_not_fail_it(service, ray_head):
    client = service.client()
    wait_for_warm_driver_interpreter(client)  # the node's fork server, which run drivers use
    # 1437 training images make no full batch of 4096: that trial fails in every worker.
    created = client.create_sweep(sweep_spec("ok-and-broken", {"data.batch_size": {"grid": [64, 4096]}}))
    assert created.status is SweepStatus.QUEUED and created.driver == "service"

    sweep = client.wait_sweep(created.id, timeout=300)

    assert sweep.status is SweepStatus.COMPLETED, (sweep.error, sweep.message)
    assert sweep.attempt == 1 and sweep.counts == {"COMPLETED": 1, "FAILED": 1}
    runs = by_batch_size(client, sweep.id)
    good, broken = runs[64], runs[4096]
    assert good.sweep_id == broken.sweep_id == sweep.id and good.trial_id and broken.trial_id
    assert good.status is RunStatus.COMPLETED and good.best["eval/accuracy"] > 0.2
    assert broken.status is RunStatus.FAILED and "no full batch of 4096" in broken.error
    assert broken.attempt == 1  # a trial that failed for a reason other than "no workers" is not retried
    trials = {t.run_id: t for t in sweep.trials}
    assert trials[good.id].params == {"data.batch_size": 64} and trials[good.id].progress == 1.0
    assert trials[good.id].metric == pytest.approx(good.best["eval/accuracy"])
    assert sweep.pareto == [good.id] and sweep.best_run_id == good.id
    assert "2 trial(s)" in sweep.message
    # A trial's log is its sweep driver's, which was forked from the node's warm interpreter as
    # run drivers are. (This suite sets Ray Train's start timeout for every job; `make serve`
    # sets it for sweep drivers only, which the server's key leaves out: test_fork_server.)
    assert "workers.tune forked as pid" in client.logs(good.id).text
    assert "evaluation at the end of epoch 1, batch" in client.logs(good.id).text  # rank 0's lines, as a run's
    assert "\x1b[36m(" not in client.logs(good.id).text  # Ray's line prefixes without colour codes
    # Once the driver's job ended, the service stored its log under the sweep and had Ray forget
    # the job (so Ray's job list, read every tick, does not grow with every sweep); the trials'
    # logs are read from the stored copy.
    from ray.job_submission import JobSubmissionClient

    jobs, driver_job = JobSubmissionClient(ray_head.dashboard_url), f"sweep-{sweep.id}-attempt-1"
    wait_until(lambda: driver_job not in {job.submission_id for job in jobs.list_jobs()}, timeout=90, interval=1,
               what="Ray to forget the sweep driver's job")
    for trial in (good, broken):
        page = client.logs(trial.id)
        assert page.source == "storage" and "workers.tune forked as pid" in page.text, (page.source, page.size)


def test_canceling_a_sweep_stops_its_driver_and_every_trial(service, ray_head):
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors

    client = service.client()
    long = {**BASE, "max_duration": "2000ep", "eval_interval": "50ep"}
    created = client.create_sweep({**sweep_spec("to-cancel", {}), "base": long})  # one trial: the base
    wait_until(lambda: any(r.status is RunStatus.RUNNING for r in client.iter_runs(sweep_id=created.id)),
               timeout=180, what="a trial to train")

    jobs = JobSubmissionClient(ray_head.dashboard_url)
    driver_job = jobs.get_job_info(f"sweep-{created.id}-attempt-1").job_id

    def training_actors() -> list:
        # This sweep's only: they all belong to its driver's Ray job. Another module's run on
        # the shared head (seen once in CI: a dashboard test's run whose job read STOPPED while
        # its driver still trained) is not this test's business.
        alive = list_actors(address=ray_head.dashboard_url, limit=1000,
                            filters=[("state", "=", "ALIVE"), ("job_id", "=", driver_job)])
        return [a for a in alive if a.class_name in TRAIN_WORKER_ACTORS]

    wait_until(training_actors, timeout=60, what="the trial's training actors, under the driver's job")
    client.cancel_sweep(created.id)
    sweep = client.wait_sweep(created.id, timeout=90)

    assert sweep.status is SweepStatus.CANCELED
    assert {r.status for r in client.iter_runs(sweep_id=sweep.id)} == {RunStatus.CANCELED}
    assert jobs.get_job_status(f"sweep-{sweep.id}-attempt-1").value == "STOPPED"

    def nothing_trains():
        return not training_actors()

    wait_until(nothing_trains, timeout=60, interval=1, what="the trials' actors and workers to end")


def test_an_external_sweep_driven_in_process_stops_when_it_is_canceled(service, ray_client, tmp_path):
    from workers.tune import run_sweep

    client = service.client()
    long = {**BASE, "max_duration": "2000ep", "eval_interval": "50ep"}
    spec = SweepSpec.model_validate({**sweep_spec("external", {}), "base": long})
    canceled = []

    def cancel_once_training():  # Tune runs in this test's main thread; cancel from the side
        sweep = wait_until(lambda: next((s for s in client.list_sweeps().data if s.name == "external"), None),
                           timeout=60, what="the external sweep")
        wait_until(lambda: any(r.status is RunStatus.RUNNING for r in client.iter_runs(sweep_id=sweep.id)),
                   timeout=180, what="its trial to train")
        canceled.append(client.cancel_sweep(sweep.id))

    canceller = threading.Thread(target=cancel_once_training, daemon=True)
    canceller.start()
    outcome = run_sweep(spec, client=client, storage_url=f"file://{tmp_path}", verbose=0)
    canceller.join(timeout=10)

    assert canceled and canceled[0].status is SweepStatus.CANCELED and canceled[0].driver == "external"
    [trial] = outcome.trials
    assert outcome.sweep_id == canceled[0].id and trial.status == "STOPPED" and trial.run_id is not None
    assert client.get_run(trial.run_id).status is RunStatus.CANCELED
    assert client.get_sweep(outcome.sweep_id).status is SweepStatus.CANCELED  # the driver reported nothing after


def test_a_killed_driver_is_requeued_and_restores_tune_without_rerunning_finished_trials(service):
    client = service.client()
    # One trial at a time: a 2-epoch trial finishes, then the driver dies during the 400-epoch one.
    # One-worker trials start in a reused actor and train ~1 ms a batch here: the long one must
    # outlast Tune's next state save (~10 s), and saves every 20 epochs so its resume is short.
    created = client.create_sweep({**sweep_spec("restored", {"max_duration": {"grid": ["2ep", "400ep"]}},
                                                max_concurrent_trials=1),
                                   "base": {**BASE, "checkpoint": {"interval": "20ep"}}})
    experiment = service.log_path.parent / "storage" / "sweeps" / created.id / "tune"

    def trials_in(status: RunStatus):
        return {r.spec["max_duration"]: r for r in client.iter_runs(sweep_id=created.id) if r.status is status}

    short = wait_until(lambda: trials_in(RunStatus.COMPLETED).get("2ep"), timeout=240, what="the short trial")
    # Tune saves its experiment state every ~10 s: wait until it holds the short trial as done.
    wait_until(lambda: terminated_trials(experiment) >= {short.trial_id}, timeout=60,
               what="Tune's saved state to hold the finished trial")
    wait_until(lambda: trials_in(RunStatus.RUNNING).get("400ep"), timeout=120, what="the long trial to train")
    driver = wait_until(lambda: driver_process(created.id), timeout=10, what="the driver process")
    driver.kill()

    requeued = wait_until(lambda: client.get_sweep(created.id).attempt == 2, timeout=120,
                          what="the sweep to be re-queued as attempt 2")
    assert requeued
    sweep = client.wait_sweep(created.id, timeout=300)

    assert sweep.status is SweepStatus.COMPLETED and sweep.attempt == 2, (sweep.error, sweep.message)
    runs = {r.spec["max_duration"]: r for r in client.iter_runs(sweep_id=sweep.id)}
    assert set(runs) == {"2ep", "400ep"}  # no trial was created twice
    assert runs["2ep"].status is RunStatus.COMPLETED and runs["2ep"].attempt == 1  # not registered again
    assert runs["400ep"].status is RunStatus.COMPLETED and runs["400ep"].attempt == 2  # resumed by the new driver
    assert runs["2ep"].id == short.id


def terminated_trials(experiment) -> set[str]:
    done = set()
    for state_file in experiment.glob("experiment_state-*.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):  # being written
            continue
        for trial_json, _ in state.get("trial_data", []):
            trial = json.loads(trial_json)
            if trial.get("status") == "TERMINATED":
                done.add(trial["trial_id"])
    return done


def driver_process(sweep_id: str) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "workers.tune" in cmdline and sweep_id in cmdline and "python" in cmdline[0]:
            return proc
    time.sleep(0.2)
    return None
