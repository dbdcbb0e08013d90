"""On a Ray cluster the service did not start, the dispatcher has the head node's warm driver
interpreter started once Ray answers (``service.driver_warmup``), with the interpreter a run's
and a sweep's driver ask for, and has Ray forget the job once it has finished; again after Ray
did not answer; never on an embedded head, whose start-up probe does it."""

from __future__ import annotations

import pytest

from api.sweeps import SweepSpec
from service.dispatcher import Dispatcher
from service.driver_warmup import JOB_PREFIX
from service.ray_client import RayAmbiguous, RayRefused
from service.settings import Settings
from workers.fork_exec import server_env

EXTERNAL = "http://ray-head.test:8265"


@pytest.fixture
def external(settings) -> Settings:
    return settings.model_copy(update={"ray_address": EXTERNAL})


def warmups(fake_jobs) -> list[str]:
    return [job_id for job_id in fake_jobs.submit_calls if job_id.startswith(JOB_PREFIX)]


def test_the_first_tick_warms_the_interpreter_that_run_and_sweep_drivers_ask_for(
        sqlite_repo, fake_jobs, external, example_spec, example_body, monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_SOMETHING", "1")  # forwarded to every job: part of the interpreter's key
    dispatcher = Dispatcher(sqlite_repo, fake_jobs, external)
    run = dispatcher.repo.create_run(example_spec)
    sweep = dispatcher.sweeps.create_sweep(SweepSpec.model_validate({
        "name": "s", "base": example_body, "search": {"algorithms": {"sets": [[]]}}}))
    dispatcher.tick()
    [warm] = warmups(fake_jobs)
    job = fake_jobs.jobs[warm]
    assert job["entrypoint"] == "/opt/venv/bin/python -m workers.fork_exec --warm"
    assert job["env"]["RAY_TRAIN_SOMETHING"] == "1"
    for driver in (f"run-{run.id}-attempt-1", f"sweep-{sweep.id}-attempt-1"):
        assert server_env(fake_jobs.jobs[driver]["env"]) == server_env(job["env"]), driver
    assert not any(name.startswith("TESSERA_") for name in job["env"])  # no run's token or id

    dispatcher.tick()  # still running: left alone, not sent again
    assert warmups(fake_jobs) == [warm] and warm in fake_jobs.jobs
    fake_jobs.set_status(warm, "SUCCEEDED")
    dispatcher.tick()  # finished: Ray forgets it
    assert warm not in fake_jobs.jobs and warmups(fake_jobs) == [warm]
    dispatcher.tick()
    assert warmups(fake_jobs) == [warm]


def test_a_ray_that_did_not_answer_is_warmed_again_once_it_does(sqlite_repo, fake_jobs, external):
    dispatcher = Dispatcher(sqlite_repo, fake_jobs, external)
    dispatcher.tick()
    [first] = warmups(fake_jobs)
    fake_jobs.set_status(first, "SUCCEEDED")
    dispatcher.tick()
    dispatcher.jobs.states = lambda: (_ for _ in ()).throw(RayAmbiguous("Ray did not answer in 10 s"))
    dispatcher.tick()  # Ray down: nothing sent
    assert warmups(fake_jobs) == [first] and dispatcher.ray_error
    del dispatcher.jobs.states
    dispatcher.tick()  # it answers again, maybe as a restarted head whose node has no interpreter
    assert len(warmups(fake_jobs)) == 2 and warmups(fake_jobs)[1] in fake_jobs.jobs


def test_an_unanswered_submit_is_followed_up_and_a_refused_one_not_repeated(sqlite_repo, fake_jobs, external):
    dispatcher = Dispatcher(sqlite_repo, fake_jobs, external)
    fake_jobs.fail_submit = RayAmbiguous("Ray answered POST /api/jobs/ with 503")
    dispatcher.tick()  # the job may or may not exist: its id is kept and looked for
    fake_jobs.fail_submit = None
    dispatcher.tick()  # Ray has no such job: a new one
    tried, sent = warmups(fake_jobs)
    assert tried not in fake_jobs.jobs and sent in fake_jobs.jobs
    fake_jobs.set_status(sent, "SUCCEEDED")

    refusing = Dispatcher(sqlite_repo, fake_jobs, external)
    fake_jobs.fail_submit = RayRefused("Ray answered POST /api/jobs/ with 403")
    refusing.tick()
    refusing.tick()
    assert len(warmups(fake_jobs)) == 3  # refused once, not asked again every tick


def test_an_embedded_head_or_drivers_that_start_cold_are_not_warmed_by_the_dispatcher(
        sqlite_repo, fake_jobs, settings, external, monkeypatch):
    Dispatcher(sqlite_repo, fake_jobs, settings).tick()  # no ray_address: the service's own head
    monkeypatch.setenv("TESSERA_DRIVER_FORKS", "0")
    Dispatcher(sqlite_repo, fake_jobs, external).tick()
    assert warmups(fake_jobs) == []
