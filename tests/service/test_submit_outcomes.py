"""How the dispatcher decides on a submit whose answer was lost, and on a re-queued attempt
whose previous job still runs, against a fake Ray (docs/outages-service.md)."""

from __future__ import annotations

import pytest

from api.views import RunStatus
from service.dispatcher import Dispatcher
from service.ray_client import RayAmbiguous, RayRefused, RayUnavailable
from tests.service.conftest import FakeJobs

S = RunStatus


class FlakyRay(FakeJobs):
    """A fake Ray whose next submits fail as scripted: ``created`` says whether Ray made the job
    before the answer was lost (a 5xx or timeout after Ray acted); an entry ``(None, _)`` is a
    submit that goes through. ``status_calls`` lists the jobs Ray was asked about."""

    def __init__(self):
        super().__init__()
        self.script: list[tuple[Exception | None, bool]] = []
        self.states_error: Exception | None = None
        self.status_calls: list[str] = []
        self.stop_error: Exception | None = None

    def submit(self, submission_id, entrypoint, env_vars):
        error, created = self.script.pop(0) if self.script else (None, False)
        if error is None:
            super().submit(submission_id, entrypoint, env_vars)
            return
        self.submit_calls.append(submission_id)
        if created:
            self.jobs.setdefault(submission_id, {"status": "PENDING", "entrypoint": entrypoint, "env": env_vars})
        raise error

    def status(self, submission_id):
        self.status_calls.append(submission_id)
        return super().status(submission_id)

    def stop(self, submission_id):
        if self.stop_error is not None:
            raise self.stop_error
        super().stop(submission_id)

    def states(self):
        if self.states_error is not None:
            raise self.states_error
        return {job_id: job["status"] for job_id, job in self.jobs.items()}


@pytest.fixture
def ray() -> FlakyRay:
    return FlakyRay()


@pytest.fixture
def dispatcher(sqlite_repo, ray, settings) -> Dispatcher:
    return Dispatcher(sqlite_repo, ray, settings.model_copy(update={"ray_submit_retries": 2}))


def ambiguous(text="Ray answered POST /api/jobs/ with 500: no available agent"):
    return RayAmbiguous(text)


def test_an_ambiguous_submit_that_ray_did_accept_proceeds_without_a_second_job(dispatcher, ray, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    job_id = f"run-{run.id}-attempt-1"
    ray.script = [(ambiguous(), True)]
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.STARTING  # not FAILED, though Ray said 500
    dispatcher.tick()  # asks Ray for the job by its id: there it is
    dispatcher.tick()
    assert ray.submit_calls == [job_id] and list(ray.jobs) == [job_id]
    stored = dispatcher.repo.get_run(run.id)
    assert (stored.status, stored.attempt) == (S.STARTING, 1)


def test_an_ambiguous_submit_ray_did_not_get_is_sent_again_under_the_same_id(dispatcher, ray, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    job_id = f"run-{run.id}-attempt-1"
    ray.script = [(ambiguous(), False), (RayAmbiguous("did not answer within 10s"), False)]
    for _ in range(4):
        dispatcher.tick()
    assert ray.submit_calls == [job_id] * 3 and list(ray.jobs) == [job_id]
    token = ray.jobs[job_id]["env"]["TESSERA_RUN_TOKEN"]
    assert dispatcher.repo.check_token(run.id, token)  # the resent job carries the attempt's token
    assert dispatcher.repo.get_run(run.id).status is S.STARTING


def test_a_submit_ray_never_gets_fails_the_run_after_the_retries_with_the_reason(dispatcher, ray, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    ray.script = [(ambiguous("Ray answered POST /api/jobs/ with 503: busy"), False)] * 3
    for _ in range(6):
        dispatcher.tick()
    failed = dispatcher.repo.get_run(run.id)
    assert failed.status is S.FAILED and len(ray.submit_calls) == 3 and not ray.jobs
    assert f"Ray did not create job run-{run.id}-attempt-1 after 3 submit(s)" in failed.error
    assert "503: busy" in failed.error and failed.failure == "machine"  # Ray's doing, not the run's code


def test_a_4xx_fails_the_run_at_once(dispatcher, ray, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    ray.script = [(RayRefused("Ray refused POST /api/jobs/ with 400: bad runtime_env"), False)]
    dispatcher.tick()
    failed = dispatcher.repo.get_run(run.id)
    assert failed.status is S.FAILED and "bad runtime_env" in failed.error and ray.submit_calls == [failed.ray_job_id]


def test_while_ray_cannot_be_asked_nothing_is_decided_and_the_tick_stops_asking(dispatcher, ray, example_spec):
    first, second = dispatcher.repo.create_run(example_spec), dispatcher.repo.create_run(example_spec)
    ray.script = [(ambiguous(), False)]
    dispatcher.tick()
    assert len(ray.submit_calls) == 1  # the second run waits: one failed call ends the tick's Ray work
    assert dispatcher.repo.get_run(second.id).status is S.QUEUED  # a tick's first run is sent alone
    ray.states_error = RayUnavailable("Ray's Jobs API did not answer within 10s")
    for _ in range(3):
        dispatcher.tick()
    assert dispatcher.ray_error is not None and len(ray.submit_calls) == 1
    assert dispatcher.repo.get_run(first.id).status is S.STARTING
    ray.states_error = None
    dispatcher.tick()
    dispatcher.tick()
    assert dispatcher.ray_error is None
    assert sorted(ray.jobs) == sorted([f"run-{first.id}-attempt-1", f"run-{second.id}-attempt-1"])


def test_a_requeued_attempt_waits_until_the_previous_attempts_job_is_stopped(dispatcher, ray, example_spec):
    run = dispatcher.repo.create_run(example_spec)
    dispatcher.tick()
    old_job = f"run-{run.id}-attempt-1"
    ray.set_status(old_job, "RUNNING")
    ray.stop = lambda job_id: ray.stop_calls.append(job_id)  # Ray stops asynchronously
    dispatcher.repo.transition(run.id, S.FAILED, error="worker reported a crash")  # the job lingers
    dispatcher.repo.resume_run(run.id)
    dispatcher.tick()
    dispatcher.tick()
    assert ray.stop_calls == [old_job, old_job] and dispatcher.repo.get_run(run.id).status is S.QUEUED
    assert list(ray.jobs) == [old_job]
    ray.set_status(old_job, "STOPPED")
    dispatcher.tick()
    assert dispatcher.repo.get_run(run.id).status is S.STARTING and f"run-{run.id}-attempt-2" in ray.jobs


def test_when_ray_stops_answering_mid_batch_the_rest_wait_unsent_and_go_next_tick(dispatcher, ray, example_spec):
    runs = [dispatcher.repo.create_run(example_spec) for _ in range(4)]
    ray.script = [(None, True), (None, True), (ambiguous(), False)]  # the tick's first run, then a batch of 3
    dispatcher.tick()
    assert len(ray.submit_calls) == 3
    unsent = runs[3]
    pending = dispatcher.followers[0].pending[unsent.id]
    assert pending.sends == 0 and dispatcher.repo.get_run(unsent.id).status is S.STARTING
    asked_before = len(ray.status_calls)
    dispatcher.tick()
    assert f"run-{unsent.id}-attempt-1" in ray.jobs
    asked = ray.status_calls[asked_before:]
    assert f"run-{unsent.id}-attempt-1" not in asked  # never sent: nothing to ask Ray about first
    assert unsent.id not in dispatcher.followers[0].pending


def test_a_ray_failure_while_a_previous_job_is_checked_leaves_the_whole_batch_queued(dispatcher, ray, example_spec):
    first, fresh, requeued = (dispatcher.repo.create_run(example_spec) for _ in range(3))
    dispatcher.repo.begin_attempt(requeued.id, token="t")
    dispatcher.repo.transition(requeued.id, S.QUEUED, message="Ray job not found")  # attempt 2: its old job is checked
    ray.stop_error = RayUnavailable("Ray's Jobs API did not answer within 10s")
    dispatcher.tick()  # the first run goes alone; then [fresh, requeued]: asking about requeued's old job fails
    assert ray.submit_calls == [f"run-{first.id}-attempt-1"]
    assert dispatcher.repo.get_run(fresh.id).status is S.QUEUED  # not STARTING with nobody to send it
    assert dispatcher.repo.get_run(requeued.id).status is S.QUEUED
    ray.stop_error = None
    dispatcher.tick()
    assert f"run-{fresh.id}-attempt-1" in ray.jobs and f"run-{requeued.id}-attempt-2" in ray.jobs
