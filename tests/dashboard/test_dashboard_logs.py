"""The log pane in a real browser: on the run page it follows a live attempt by byte offset
(each poll asks only for new bytes) and stops asking once the run has ended; a FAILED run shows
its traceback there. The sweep page shows its driver's log the same way."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from api.views import RunStatus
from tests.dashboard.conftest import dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_pages import EXAMPLE, api_requests, make_run

TRACEBACK = ('Traceback (most recent call last):\n  File "workers/trainer.py", line 212, in fit\n'
             "RuntimeError: CUDA out of memory\n")


def test_log_pane_follows_a_live_run_then_shows_the_traceback_of_its_failure(page, local_service):
    run = make_run(local_service.repo, "logs-pane")
    jobs = local_service.app.state.jobs
    job_id = f"run-{run.id}-attempt-1"
    # As Ray prefixes a worker's lines on a terminal: the pane shows the text without the colour codes.
    jobs.logs[job_id] = "".join(f"\x1b[36m(RayTrainWorker pid=7)\x1b[0m [rank 0] epoch 1 batch {b} loss {2.0 / b:.4f}\n"
                                for b in range(1, 30))
    log_requests = api_requests(page, "/logs?")
    run_polls = api_requests(page, f"/api/v1/runs/{run.id}/events")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    log = page.locator("#run-log")
    expect(log).to_contain_text("batch 29 loss")
    assert "(RayTrainWorker pid=7) [rank 0] epoch 1 batch 1 loss" in log.inner_text() and "[36m" not in log.inner_text()
    expect(page.locator("#run-log-note")).to_contain_text("following the live attempt")
    expect(page.locator("#run-log-attempt")).to_be_hidden()  # one attempt: nothing to choose

    jobs.logs[job_id] += TRACEBACK
    local_service.repo.transition(run.id, RunStatus.FAILED, error="RuntimeError: CUDA out of memory")
    expect(log).to_contain_text("RuntimeError: CUDA out of memory")
    # The run has ended; its job, whose driver writes its last lines as it exits, not yet.
    expect(page.locator("#run-log-note")).to_contain_text("following the live attempt")
    jobs.logs[job_id] += "workers.launch: run failed\n"
    jobs.ended[job_id] = "FAILED"
    expect(log).to_contain_text("workers.launch: run failed")
    expect(page.locator("#run-log-note")).to_contain_text("ended")
    assert log.inner_text().count("batch 1 loss") == 1  # nothing fetched twice
    offsets = [int(re.search(r"after=(\d+)", url).group(1)) for url in log_requests]
    assert offsets[0] == 0 and offsets.count(0) == 1 and offsets == sorted(offsets)
    asked, polls = len(log_requests), len(run_polls)
    while len(run_polls) < polls + 1:  # the page polls on (events every 5th poll); the log pane does not
        page.wait_for_timeout(200)
    assert len(log_requests) == asked
    page.locator("#run-log").scroll_into_view_if_needed()
    save_screenshot(page, "run-logs-1280", full_page=False)


def test_an_earlier_attempts_traceback_is_read_after_a_resume_and_the_choice_stays(page, local_service):
    repo, jobs = local_service.repo, local_service.app.state.jobs
    run = make_run(repo, "logs-attempts")

    def next_attempt(log: str) -> None:
        jobs.ended[f"run-{run.id}-attempt-{repo.get_run(run.id).attempt}"] = "FAILED"
        repo.resume_run(run.id)
        repo.begin_attempt(run.id, token=f"token-{log[:8]}")
        repo.transition(run.id, RunStatus.RUNNING)
        jobs.logs[f"run-{run.id}-attempt-{repo.get_run(run.id).attempt}"] = log

    jobs.logs[f"run-{run.id}-attempt-1"] = "attempt one trains\n" + TRACEBACK
    repo.transition(run.id, RunStatus.FAILED, error="RuntimeError: CUDA out of memory")
    next_attempt("attempt two resumes from its checkpoint\n")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    log, note, picker = page.locator("#run-log"), page.locator("#run-log-note"), page.locator("#run-log-attempt")
    expect(log).to_contain_text("attempt two resumes")
    expect(picker).to_be_visible()
    expect(picker.locator("option")).to_have_text(["attempt 2 (newest)", "attempt 1"])
    expect(page.get_by_label("Log of")).to_have_value("")  # labelled, and following the newest

    picker.select_option("1")
    expect(log).to_contain_text("RuntimeError: CUDA out of memory")
    expect(log).not_to_contain_text("attempt two")
    expect(note).to_contain_text("Attempt 1 of 2")
    expect(note).to_contain_text("ended")
    page.locator("#run-log").scroll_into_view_if_needed()
    save_screenshot(page, "run-logs-attempt-1280", full_page=False)

    # A third attempt starts: the reader stays on the attempt chosen, and can follow the newest again.
    repo.transition(run.id, RunStatus.FAILED, error="again")
    next_attempt("attempt three resumes\n")
    expect(picker.locator("option")).to_have_text(["attempt 3 (newest)", "attempt 2", "attempt 1"])
    expect(picker).to_have_value("1")
    expect(log).not_to_contain_text("attempt three")
    assert log.inner_text().count("attempt one trains") == 1
    picker.select_option("")
    expect(log).to_contain_text("attempt three resumes")
    expect(log).not_to_contain_text("RuntimeError")
    expect(note).to_contain_text("Attempt 3 of 3")
    expect(note).to_contain_text("following the live attempt")


def test_sweep_page_shows_its_driver_log_and_stops_asking_once_the_sweep_ended(page, local_service):
    from api.sweeps import SweepSpec
    from api.views import SweepStatus
    from service.sweep_repository import SweepRepository

    sweeps = SweepRepository(local_service.repo)
    spec = {"name": "driver-log", "base": {**EXAMPLE, "name": "driver-log"},
            "search": {"algorithms": {"sets": [[], ["channels_last"]]}}}
    sweep = sweeps.create_sweep(SweepSpec.model_validate(spec))
    sweeps.begin_attempt(sweep.id, token="driver-token")
    sweeps.apply_driver_report(sweep.id, SweepStatus.RUNNING)
    jobs, job_id = local_service.app.state.jobs, f"sweep-{sweep.id}-attempt-1"
    jobs.logs[job_id] = "== Status ==\nTrial t1 RUNNING lr=0.1\n"
    log_requests = api_requests(page, f"/api/v1/sweeps/{sweep.id}/logs?")
    sweep_polls = api_requests(page, f"/api/v1/sweeps/{sweep.id}")
    page.goto(dashboard_url(local_service.url, f"sweeps/{sweep.id}"))
    log = page.locator("#sweep-log")
    expect(log).to_contain_text("Trial t1 RUNNING")
    expect(page.locator("#sweep-log-note")).to_contain_text("following the live attempt")

    jobs.logs[job_id] += "Trial t1 TERMINATED\n"
    sweeps.apply_driver_report(sweep.id, SweepStatus.COMPLETED)
    jobs.ended[job_id] = "SUCCEEDED"
    expect(log).to_contain_text("Trial t1 TERMINATED")
    expect(page.locator("#sweep-log-note")).to_contain_text("ended")
    assert log.inner_text().count("Trial t1 RUNNING") == 1  # nothing fetched twice
    asked, polls = len(log_requests), len(sweep_polls)
    while len(sweep_polls) < polls + 1:  # the page polls on; the log pane does not
        page.wait_for_timeout(200)
    assert len(log_requests) == asked
