"""Empty and edge states say what is true, in a real browser against the app over SQLite: a run
without eval data never charts accuracy and says so, an ended run's empty charts do not wait for
points, a failed run shows its error once and highlights no resume that would fail again, a sweep
that ended before any trial says it ended (and its error) instead of waiting for trials, and the
empty sweeps page names the CLI."""

from __future__ import annotations

import copy
import re
import time

from playwright.sync_api import expect

from api.views import RunStatus
from tests.dashboard.conftest import dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_pages import EXAMPLE, add_losses, make_run
from tests.dashboard.test_dashboard_housekeeping import external_sweep

SWEEP_ERROR = ('Traceback (most recent call last):\n  File "workers/tune.py", line 88, in run_sweep\n'
               "ValueError: search space is empty after skipping every algorithm set\n")


def test_a_run_without_eval_data_says_so_where_accuracy_would_be_charted(page, local_service):
    data = copy.deepcopy(EXAMPLE["data"])
    del data["eval"]
    no_eval = make_run(local_service.repo, "no-eval", data=data, eval_interval=None)
    add_losses(local_service.repo, no_eval.id, range(1, 11))
    page.goto(dashboard_url(local_service.url, f"runs/{no_eval.id}"))
    expect(page.locator("#chart-loss")).to_have_attribute("data-points", "10")
    quality = page.locator("#chart-quality")
    expect(quality.locator(".chart-empty")).to_have_text(
        "No eval data set: this run's spec has no data.eval, so it reports no accuracy or perplexity.")
    expect(quality).to_have_attribute("data-never", "true")
    expect(page.locator("#chart-throughput .chart-empty")).to_have_text("No points yet.")

    with_eval = make_run(local_service.repo, "with-eval")
    page.goto(dashboard_url(local_service.url, f"runs/{with_eval.id}"))
    expect(page.locator("#chart-quality")).to_have_attribute("data-never", "false")
    expect(page.locator("#chart-quality .chart-empty")).to_have_text("No points yet.")


def test_a_failed_run_shows_its_error_once_and_its_empty_charts_expect_no_more_points(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "failed-once")
    add_losses(repo, run.id, range(1, 6))
    repo.transition(run.id, RunStatus.FAILED, error="ValueError: lr must be positive, got -0.1")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    error = page.locator("#run-error")
    expect(error).to_have_text("Error: ValueError: lr must be positive, got -0.1")  # once: no copy under it
    expect(page.locator('#events li[data-to="FAILED"]')).to_contain_text("lr must be positive")  # its event
    # Ended: its throughput never comes, and "yet" would say it may.
    expect(page.locator("#chart-throughput .chart-empty")).to_have_text("No points reported.")
    expect(page.locator("#chart-loss")).to_have_attribute("data-points", "5")
    # A code error fails again: Resume stays offered, but it is not the highlighted action.
    resume = page.locator("#resume-run")
    expect(resume).to_be_visible()
    expect(resume).not_to_have_class(re.compile(r"\bprimary\b"))
    expect(page.locator(".page-head .actions button.primary")).to_have_count(0)

    # A traceback: its first line once as the summary, the rest under it, nothing twice.
    traced = make_run(repo, "failed-traceback")
    repo.transition(traced.id, RunStatus.FAILED, error=SWEEP_ERROR)
    page.goto(dashboard_url(local_service.url, f"runs/{traced.id}"))
    expect(error.locator("summary")).to_have_text("Error: Traceback (most recent call last):")
    expect(error.locator("pre")).to_contain_text("line 88, in run_sweep")
    text = error.inner_text()
    assert text.count("Traceback (most recent call last)") == 1 and text.count("search space is empty") == 1

    # What the worker or dispatcher recorded decides, whatever the error's words say.
    machine = make_run(repo, "failed-machine-recorded")
    repo.transition(machine.id, RunStatus.FAILED, error="WorkerHealthCheckFailedError: worker 1 stopped answering",
                    failure="machine")
    page.goto(dashboard_url(local_service.url, f"runs/{machine.id}"))
    expect(page.locator("#resume-run")).to_have_class(re.compile(r"\bprimary\b"))
    code = make_run(repo, "failed-code-recorded")
    repo.transition(code.id, RunStatus.FAILED, error="RuntimeError: node 3 of the graph died", failure="code")
    page.goto(dashboard_url(local_service.url, f"runs/{code.id}"))
    expect(page.locator("#resume-run")).to_be_visible()
    expect(page.locator("#resume-run")).not_to_have_class(re.compile(r"\bprimary\b"))

    # A run that failed before its failure was recorded: its error's words are the clue.
    # A lost node is not the code's fault: another attempt may well pass, so Resume leads.
    lost = make_run(repo, "failed-node-lost")
    repo.transition(lost.id, RunStatus.FAILED, error="NodeDiedError: node 10.0.0.7 died (preempted)")
    page.goto(dashboard_url(local_service.url, f"runs/{lost.id}"))
    expect(page.locator("#resume-run")).to_have_class(re.compile(r"\bprimary\b"))
    # Nor is a job the service saw end without a result (service/job_kinds.py's words).
    vanished = make_run(repo, "failed-job-vanished")
    repo.transition(vanished.id, RunStatus.FAILED, error="Ray job ended without reporting a result")
    page.goto(dashboard_url(local_service.url, f"runs/{vanished.id}"))
    expect(page.locator("#resume-run")).to_have_class(re.compile(r"\bprimary\b"))
    canceled = make_run(repo, "canceled-resumable", status=RunStatus.CANCELING)
    repo.transition(canceled.id, RunStatus.CANCELED)
    page.goto(dashboard_url(local_service.url, f"runs/{canceled.id}"))
    expect(page.locator("#resume-run")).to_have_class(re.compile(r"\bprimary\b"))
    expect(page.locator("#chart-loss .chart-empty")).to_have_text("No points reported.")


def test_a_sweep_that_ended_without_a_trial_says_so_and_shows_its_error(page, local_service):
    from api.views import SweepStatus

    sweeps = local_service.app.state.sweeps
    waiting = external_sweep(local_service, "no-trial-yet")
    page.goto(dashboard_url(local_service.url, f"sweeps/{waiting.id}"))
    empty = page.locator("#trials-empty")
    expect(empty).to_have_text("No trials yet: the driver registers each one as it starts.")

    sweeps.apply_driver_report(waiting.id, SweepStatus.FAILED, error=SWEEP_ERROR)
    expect(page.locator(".page-head .badge")).to_have_text("✕ FAILED")
    expect(empty).to_contain_text("This sweep ended FAILED with no trial: none started.")
    expect(empty.locator("code")).to_have_text(
        "ValueError: search space is empty after skipping every algorithm set")
    expect(page.locator(".error-box pre")).to_contain_text("line 88, in run_sweep")  # the whole error, above
    expect(page.locator("#trials-table")).to_be_hidden()
    save_screenshot(page, "sweep-failed-no-trial-1280")

    canceled = external_sweep(local_service, "canceled-early")
    sweeps.cancel(canceled.id)
    page.goto(dashboard_url(local_service.url, f"sweeps/{canceled.id}"))
    expect(empty).to_have_text("This sweep ended CANCELED with no trial: none started.")
    expect(empty).not_to_contain_text("registers")


def test_the_empty_sweeps_page_names_the_cli_command_and_the_example(page, local_service):
    project = f"empty-{time.monotonic_ns() % 10**9}"
    local_service.app.state.access.create_project(project)
    external_sweep(local_service, "elsewhere")  # in "default": not in the project chosen below
    page.goto(dashboard_url(local_service.url, "sweeps"))
    page.select_option("#project", project)
    empty = page.locator("#sweeps-empty")
    expect(empty).to_be_visible()
    expect(empty.locator("code")).to_have_text([
        "tessera sweeps submit examples/digits_sweep.yaml", "POST /api/v1/sweeps", "workers.tune.run_sweep",
        "docs/sweeps.md"])
    expect(page.locator("#sweeps-table")).to_be_hidden()
    expect(page.locator("#sweeps-count")).to_have_text(re.compile(r"^0 sweeps"))
    save_screenshot(page, "sweeps-empty-1280", full_page=False)
