"""The run page's log pane in a real browser: it follows a live attempt by byte offset (each
poll asks only for new bytes) and stops asking once the run has ended; a FAILED run shows its
traceback there."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from api.views import RunStatus
from tests.dashboard.conftest import dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_pages import api_requests, make_run

TRACEBACK = ('Traceback (most recent call last):\n  File "workers/trainer.py", line 212, in fit\n'
             "RuntimeError: CUDA out of memory\n")


def test_log_pane_follows_a_live_run_then_shows_the_traceback_of_its_failure(page, local_service):
    run = make_run(local_service.repo, "logs-pane")
    jobs = local_service.app.state.jobs
    job_id = f"run-{run.id}-attempt-1"
    jobs.logs[job_id] = "".join(f"[rank 0] epoch 1 batch {b} loss {2.0 / b:.4f}\n" for b in range(1, 30))
    log_requests = api_requests(page, "/logs?")
    run_polls = api_requests(page, f"/api/v1/runs/{run.id}/events")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    log = page.locator("#run-log")
    expect(log).to_contain_text("batch 29 loss")
    expect(page.locator("#run-log-note")).to_contain_text("following the live attempt")

    jobs.logs[job_id] += TRACEBACK
    local_service.repo.transition(run.id, RunStatus.FAILED, error="RuntimeError: CUDA out of memory")
    expect(log).to_contain_text("RuntimeError: CUDA out of memory")
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
