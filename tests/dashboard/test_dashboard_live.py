"""The dashboard in a real browser against a live service with real training: `tessera serve`
in a subprocess, PostgreSQL, a Ray head, and a run of a small CNN on synthetic data.

The tests share one training run (two would compete for two cores): the first test submits
it while the runs page is open, the last one cancels it from its run page.
"""

from __future__ import annotations

import re

import httpx
import pytest
import yaml
from playwright.sync_api import expect

from api.views import RunStatus
from tests.conftest import ADMIN_HEADERS
from tests.dashboard.conftest import NARROW, WIDE, assert_fits_width, dashboard_url, save_screenshot
from tests.e2e.conftest import wait_for_status
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration

START_TIMEOUT_MS = 180_000  # QUEUED -> RUNNING: a Ray job starts, imports torch, builds the trainer


class TrainingRun:
    """The module's one long run (cancelled by the last test, or by the service fixture)."""

    def __init__(self, service):
        self.service = service
        self.run = None

    def submit(self):
        spec = long_synthetic_spec("dashboard-live", batches=100_000)
        spec["algorithms"] = [{"name": "label_smoothing", "smoothing": 0.1}]
        self.run = self.service.client().create_run(spec)
        return self.run

    def running(self):
        """The run, RUNNING (submitted now if an earlier test did not)."""
        run = self.run or self.submit()
        return wait_for_status(self.service.client(), run.id, {RunStatus.RUNNING}, timeout=START_TIMEOUT_MS / 1000)


@pytest.fixture(scope="module")
def training(live_service):
    return TrainingRun(live_service)


def test_runs_page_shows_a_newly_submitted_run_and_its_status_changes_without_reload(page, live_service, training):
    page.goto(dashboard_url(live_service.url, "runs"))
    expect(page.locator("h1")).to_have_text("Runs")
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    run = training.submit()
    row = page.locator(f'tr[data-run-id="{run.id}"]')
    expect(row).to_be_visible(timeout=15_000)
    assert row.get_attribute("data-status") in ("QUEUED", "STARTING")
    expect(row.locator(".col-run a")).to_have_text("dashboard-live")
    expect(row.locator(".chip")).to_have_text(["label_smoothing"])

    expect(row.locator(".badge")).to_have_text("▶ RUNNING", timeout=START_TIMEOUT_MS)
    expect(row.locator(".progress-label")).to_have_text(re.compile(r"^\d+(\.\d)?%$"), timeout=60_000)
    expect(row.locator(".col-metric")).to_contain_text("train/loss", timeout=60_000)
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"
    save_screenshot(page, "runs-1280")
    assert_fits_width(page, NARROW)
    save_screenshot(page, "runs-800")


def test_run_page_chart_gains_points_while_the_run_trains(page, live_service, training):
    run = training.running()
    metric_urls: list[str] = []
    page.on("request", lambda request: metric_urls.append(request.url) if "/metrics?" in request.url else None)
    page.goto(dashboard_url(live_service.url, f"runs/{run.id}"))
    expect(page.locator(".page-head .badge")).to_have_text("▶ RUNNING")
    expect(page.locator('#events li[data-to="RUNNING"]')).to_have_count(1)

    loss = page.locator("#chart-loss")
    expect(loss).not_to_have_attribute("data-points", "0", timeout=60_000)
    before = int(loss.get_attribute("data-points"))
    page.wait_for_function(f"Number(document.querySelector('#chart-loss').dataset.points) > {before}", timeout=60_000)
    expect(loss.locator("canvas")).to_have_count(1)
    expect(page.locator("#chart-lr")).not_to_have_attribute("data-points", "0")
    expect(page.locator("#chart-throughput")).not_to_have_attribute("data-points", "0", timeout=30_000)

    # Every poll asked only for points after the last one it had.
    cursors = [int(re.search(r"after=(\d+)", url).group(1)) for url in metric_urls]
    assert cursors[0] == 0 and cursors.count(0) == 1 and cursors == sorted(cursors) and cursors[-1] > 0, cursors

    save_screenshot(page, "run-1280")
    assert_fits_width(page, NARROW)
    save_screenshot(page, "run-800")
    page.set_viewport_size({"width": WIDE, "height": 900})


def test_a_bad_spec_in_the_submit_form_shows_the_apis_field_error(page, live_service):
    spec = long_synthetic_spec("bad-lr", batches=10)
    spec["optimizer"] = {**spec["optimizer"], "lr": -0.1}
    text = yaml.safe_dump(spec, sort_keys=False)
    lr_line = next(i for i, line in enumerate(text.splitlines(), 1) if line.strip().startswith("lr:"))
    api_answer = httpx.post(f"{live_service.url}/api/v1/runs", json=spec, timeout=30, headers=ADMIN_HEADERS)
    assert api_answer.status_code == 422
    api_error = next(e for e in api_answer.json()["detail"] if e["field"] == "optimizer.lr")

    page.goto(dashboard_url(live_service.url, "submit"))
    page.fill("#spec-text", text)
    page.click("#submit-run")
    note = page.locator('.field-error[data-field="optimizer.lr"]')
    expect(note).to_contain_text(f"optimizer.lr: {api_error['msg']} (got -0.1)")
    expect(note).to_have_attribute("data-line", str(lr_line))
    # The note sits right under the spec's own `lr:` line.
    expect(page.locator(f'.source-view li[data-line="{lr_line}"] code')).to_have_text(re.compile(r"^\s*lr: -0\.1$"))
    expect(page).to_have_url(re.compile(r"#/submit$"))  # nothing was submitted
    save_screenshot(page, "submit-error-1280")
    assert_fits_width(page, NARROW)
    note.scroll_into_view_if_needed()  # below the form in a narrow window
    save_screenshot(page, "submit-error-800")


def test_cancel_asks_for_confirmation_then_cancels_the_run(page, live_service, training):
    run = training.running()
    page.goto(dashboard_url(live_service.url, f"runs/{run.id}"))
    cancel = page.locator("#cancel-run")
    dialog = page.locator("#cancel-dialog")

    cancel.click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Cancel this run?")
    page.get_by_role("button", name="Keep running").click()
    expect(dialog).to_be_hidden()
    assert live_service.client().get_run(run.id).status is RunStatus.RUNNING

    cancel.click()
    page.keyboard.press("Tab")  # focus starts on "Keep running"; the next button confirms
    expect(page.locator("#confirm-cancel")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".page-head .badge")).to_have_text("■ CANCELED", timeout=120_000)
    expect(cancel).to_be_hidden()
    expect(page.locator('#events li[data-to="CANCELING"]')).to_contain_text("canceled by key ")
    expect(page.locator('#events li[data-to="CANCELED"]')).to_have_count(1)
    assert live_service.client().get_run(run.id).status is RunStatus.CANCELED
    save_screenshot(page, "run-canceled-1280")
