"""The dashboard in a real browser (Debian's chromium) against the real app over SQLite, with
runs, events and metrics written straight into its repository: polling, ETags, cursors,
backoff, restarts in the timeline, the catalog page, keyboard use and both widths. The
tests that need real training are in test_dashboard_live.py."""

from __future__ import annotations

import copy
import json
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import expect

from api import catalog as api_catalog
from api.method_cards import CARDS, card_file_name
from api.specs import RunSpec
from api.views import ReportedMetric, RunStatus
from tests.dashboard.conftest import NARROW, POLL_MS, WIDE, assert_fits_width, dashboard_url, save_screenshot

EXAMPLE = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_resnet.yaml").read_text())


def make_run(repo, name: str, *, status: RunStatus = RunStatus.RUNNING, project: str = "default", **spec_changes):
    spec = copy.deepcopy(EXAMPLE)
    spec.update(name=name, **spec_changes)
    run = repo.create_run(RunSpec.model_validate(spec), project=project)
    if status is not RunStatus.QUEUED:
        repo.begin_attempt(run.id, token="test-token")
        if status is not RunStatus.STARTING:
            repo.transition(run.id, RunStatus.RUNNING)
            if status is not RunStatus.RUNNING:
                repo.transition(run.id, status)
    return repo.get_run(run.id)


def add_losses(repo, run_id: str, steps: range) -> None:
    now = datetime.now(timezone.utc)
    repo.add_metrics(run_id, [ReportedMetric(step=s, key="train/loss", value=2.0 / (1 + s), time=now) for s in steps])


def api_requests(page, fragment: str) -> list[str]:
    """Record the URLs of API requests containing ``fragment`` (the list fills as they happen)."""
    seen: list[str] = []
    page.on("request", lambda request: seen.append(request.url) if fragment in request.url else None)
    return seen


def test_run_page_charts_exactly_the_points_reported_and_asks_only_for_new_ones(page, local_service):
    run = make_run(local_service.repo, "cursor-check")
    add_losses(local_service.repo, run.id, range(1, 51))
    metric_requests = api_requests(page, "/metrics")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    loss = page.locator("#chart-loss")
    expect(loss).to_have_attribute("data-points", "50")
    expect(loss.locator("canvas")).to_have_count(1)  # uPlot drew it

    add_losses(local_service.repo, run.id, range(51, 81))
    expect(loss).to_have_attribute("data-points", "80")
    expect(page.locator("#chart-loss .chart-latest")).to_contain_text("train/loss 0.02469 @ step 80")

    cursors = [int(re.search(r"after=(\d+)", url).group(1)) for url in metric_requests]
    assert cursors[0] == 0 and cursors.count(0) == 1, "the whole history was requested more than once"
    assert cursors == sorted(cursors) and cursors[-1] >= 50

    # The spec's eval_metrics get a panel of their own once they report; *accuracy keys join accuracy's.
    evaluation = page.locator("#chart-eval-metrics")
    expect(evaluation).to_be_hidden()
    now = datetime.now(timezone.utc)
    local_service.repo.add_metrics(run.id, [ReportedMetric(step=12345, key=key, value=0.9, time=now) for key in
                                            ("eval/f1_macro", "eval/auroc", "eval/top5_accuracy")])
    expect(evaluation).to_have_attribute("data-points", "2")
    expect(evaluation).to_be_visible()
    expect(evaluation.locator(".chart-latest")).to_contain_text("eval/auroc 0.9 @ step 12345")  # a step whole
    expect(evaluation.locator("canvas")).to_have_count(1)
    expect(page.locator("#chart-quality")).to_have_attribute("data-points", "1")


def line_height(page, selector: str, rgb: tuple[int, int, int]) -> float:
    """How tall (CSS px) the pixels of colour `rgb` stand on the canvas under `selector`: the
    vertical room a series' line and points take on its chart."""
    return page.evaluate("""([selector, [r, g, b]]) => {
        const canvas = document.querySelector(selector);
        const { data, width, height } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
        let top = height, bottom = -1;
        for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) {
            const i = 4 * (y * width + x);
            if (data[i + 3] > 200 && Math.abs(data[i] - r) < 8 && Math.abs(data[i + 1] - g) < 8
                && Math.abs(data[i + 2] - b) < 8) { top = Math.min(top, y); bottom = Math.max(bottom, y); }
        }
        return Math.max(0, bottom - top) * canvas.getBoundingClientRect().height / canvas.height;
    }""", [selector, list(rgb)])


def test_an_eval_metric_outside_minus_1_to_1_gets_a_chart_of_its_own_and_leaves_the_scores_readable(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "eval-scales")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    expect(page.locator("#chart-loss")).to_be_visible()
    count_key = "eval/errors_per_class_3"  # a dict metric's key, as named

    def report(step: int, f1: float, auroc: float, errors: float) -> None:
        now = datetime.now(timezone.utc)
        repo.add_metrics(run.id, [ReportedMetric(step=step, key=key, value=value, time=now) for key, value in
                                  (("eval/f1_macro", f1), ("eval/auroc", auroc), (count_key, errors))])

    # A count of 0 is within [-1, 1]: it shares the scores' chart while it stays there.
    scores = page.locator("#chart-eval-metrics")
    labels = "fig => [...fig.querySelectorAll('.u-series .u-label')].slice(1).map(l => l.textContent)"
    markers = ("fig => [...fig.querySelectorAll('.u-series .u-marker')].slice(1)"
               ".map(m => getComputedStyle(m).borderColor)")
    report(10, 0.5, 0.7, 0)
    expect(scores).to_have_attribute("data-points", "3")
    assert scores.evaluate(labels) == ["eval/f1_macro", "eval/auroc", count_key]

    for step, f1, auroc, errors in ((20, 0.7, 0.8, 40), (30, 0.8, 0.9, 25), (40, 0.9, 0.95, 12)):
        report(step, f1, auroc, errors)
    count = page.locator(f'figure.chart[data-key="{count_key}"]')
    expect(count).to_have_attribute("data-points", "4")  # its 0 at step 10 moved with it
    expect(scores).to_have_attribute("data-points", "8")
    expect(count.locator("figcaption")).to_have_text(count_key)
    expect(count.locator(".chart-latest")).to_have_text(f"{count_key} 12 @ step 40")
    expect(scores.locator(".chart-latest")).not_to_contain_text("errors_per_class")
    assert scores.evaluate(labels) == ["eval/f1_macro", "eval/auroc"]
    assert scores.evaluate("fig => fig.nextElementSibling.dataset.key") == count_key  # beside the panel
    # Each key keeps the colour it had on the shared chart; the scores' y-axis is theirs alone, so
    # f1 (0.5 -> 0.9) climbs most of the chart's height instead of lying flat under a count of 40.
    assert scores.evaluate(markers) == ["rgb(31, 95, 191)", "rgb(194, 65, 12)"]
    assert count.evaluate(markers) == ["rgb(21, 128, 61)"]
    assert line_height(page, "#chart-eval-metrics canvas", (31, 95, 191)) > 60  # of 220 px; 0 beside a count
    assert line_height(page, f'figure.chart[data-key="{count_key}"] canvas', (21, 128, 61)) > 60
    # A score of -1 to 1 (a correlation, Cohen's kappa) stays with the scores.
    repo.add_metrics(run.id, [ReportedMetric(step=50, key="eval/mcc", value=-0.3, time=datetime.now(timezone.utc))])
    expect(scores).to_have_attribute("data-points", "9")
    assert scores.evaluate(labels) == ["eval/f1_macro", "eval/auroc", "eval/mcc"]

    # A run whose only eval metric is a count shows its chart alone: the scores' panel stays hidden.
    counts_only = make_run(repo, "eval-count-only")
    page.goto(dashboard_url(local_service.url, f"runs/{counts_only.id}"))
    expect(page.locator("#chart-loss")).to_be_visible()
    now = datetime.now(timezone.utc)
    repo.add_metrics(counts_only.id, [ReportedMetric(step=s, key=count_key, value=v, time=now)
                                      for s, v in ((10, 1), (20, 7), (30, 3))])
    expect(page.locator(f'figure.chart[data-key="{count_key}"]')).to_have_attribute("data-points", "3")
    expect(page.locator("#chart-eval-metrics")).to_be_hidden()


def test_events_timeline_shows_restarts_even_between_two_polls(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "restarts")
    repo.transition(run.id, RunStatus.RESTARTING, message="worker 1 died; Ray restarts the worker group")
    repo.transition(run.id, RunStatus.RUNNING)
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))

    restart = page.locator('#events li[data-to="RESTARTING"]')
    expect(restart).to_have_count(1)
    expect(restart).to_have_class(re.compile(r"\brestart\b"))
    expect(restart).to_contain_text("RUNNING → ↻ RESTARTING")
    expect(restart).to_contain_text("worker 1 died")
    expect(page.locator("#events-h")).to_contain_text("(1 restart)")

    # RUNNING -> RESTARTING -> RUNNING while the page is open: the status polled is RUNNING
    # before and after, yet the timeline must catch up.
    repo.transition(run.id, RunStatus.RESTARTING, message="second restart")
    repo.transition(run.id, RunStatus.RUNNING)
    expect(page.locator("#events-h")).to_contain_text("(2 restarts)", timeout=15_000)
    expect(restart).to_have_count(2)


def test_run_page_says_when_a_later_attempt_started_beside_the_first_start(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "restarted-group")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    expect(page.locator('[data-fact="started"]')).not_to_have_text("–")
    expect(page.locator('[data-fact="attempt started"]')).to_have_count(0)  # the first attempt: Started says it
    repo.transition(run.id, RunStatus.RESTARTING)  # Ray Train restarts the worker group: attempt 2
    repo.transition(run.id, RunStatus.RUNNING)
    restarted = repo.get_run(run.id)
    assert restarted.attempt == 2 and restarted.attempt_started_at > restarted.started_at
    expect(page.locator('[data-fact="attempt"]')).to_have_text("2")
    shown = page.locator('[data-fact="attempt started"]')
    # Today's: a clock time, in the browser's zone, to the second.
    local = page.evaluate("iso => new Date(iso).toLocaleTimeString(undefined, {hour: '2-digit', minute: '2-digit', "
                          "second: '2-digit', hour12: false})", restarted.attempt_started_at.isoformat())
    expect(shown).to_have_text(local)


def _attempt_submitted(repo, run_id: str, when: datetime) -> None:
    """Backdate the current attempt's submission, the earliest its RUNNING's start is kept at."""
    from sqlalchemy import update

    from service.db.models import Run

    with repo.engine.begin() as conn:
        conn.execute(update(Run).where(Run.id == run_id).values(attempt_started_at=when))


def _resumed_run(repo, name: str, first: datetime, *, second: datetime) -> str:
    """A run whose attempt 1 trained 10 minutes from ``first`` and failed; resumed, its attempt 2
    began training at ``second`` (it trains still)."""
    run = make_run(repo, name, status=RunStatus.STARTING)
    _attempt_submitted(repo, run.id, first)
    repo.apply_worker_report(run.id, RunStatus.RUNNING, started_at=first)
    repo.apply_worker_report(run.id, RunStatus.FAILED, error="NodeDiedError: preempted", failure="machine",
                             ended_at=first + timedelta(minutes=10))
    repo.resume_run(run.id)
    repo.begin_attempt(run.id, token="second")
    _attempt_submitted(repo, run.id, second)
    repo.apply_worker_report(run.id, RunStatus.RUNNING, started_at=second)
    return run.id


def test_a_resumed_runs_duration_is_the_time_it_trained_with_the_span_beside_it(page, local_service):
    repo = local_service.repo
    now = datetime.now(timezone.utc).replace(microsecond=0)
    # Attempt 1 trained 10 minutes two hours ago; the run waited, then attempt 2 trained 5 minutes.
    done = _resumed_run(repo, "resumed-done", now - timedelta(hours=2), second=now - timedelta(minutes=30))
    repo.apply_worker_report(done, RunStatus.COMPLETED, ended_at=now - timedelta(minutes=25))
    live = _resumed_run(repo, "resumed-live", now - timedelta(hours=1), second=now - timedelta(minutes=1))
    one = make_run(repo, "one-attempt", status=RunStatus.COMPLETED)

    page.goto(dashboard_url(local_service.url, f"runs/{done}"))
    fact = page.locator('[data-fact="duration"]')
    expect(fact).to_have_text("15m 00s (1h 35m from first start to end, 2 attempts)")
    expect(fact.locator(".duration-trained")).to_have_attribute("title", re.compile("^time trained: .*left out$"))
    expect(fact.locator(".duration-span")).to_have_attribute("title", re.compile("^wall-clock time .* included$"))

    # Training now: the time trained runs on from attempt 2's start, the span from the first start.
    page.goto(dashboard_url(local_service.url, f"runs/{live}"))
    expect(fact).to_have_text(re.compile(r"^1[12]m \d\ds \(1h 0\dm from first start to now, 2 attempts\)$"))
    shown = fact.inner_text()
    expect(fact).not_to_have_text(shown, timeout=5_000)  # the clocks tick between polls

    page.goto(dashboard_url(local_service.url, f"runs/{one.id}"))  # one attempt: its span is its time trained
    expect(fact).to_have_text(re.compile(r"^\d+s$"))
    expect(fact.locator(".duration-span")).to_have_count(0)

    page.goto(dashboard_url(local_service.url, "runs"))
    cell = page.locator(f'tr[data-run-id="{done}"] .col-duration')
    expect(cell).to_have_text("15m 00s")
    expect(cell).to_have_attribute("title", re.compile(r"left out; 1h 35m from first start to end, 2 attempts$"))
    expect(page.locator("th.col-duration")).to_have_attribute("title", re.compile("^time trained"))


def test_run_page_lists_checkpoints_and_exports_and_downloads_a_committed_ones_model(page, local_service):
    from api.views import CheckpointReport
    from service.storage_paths import export_url

    repo = local_service.repo
    run = make_run(repo, "checkpointed")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    expect(page.locator("#checkpoints")).to_contain_text("None yet.")

    now = datetime.now(timezone.utc)
    storage = local_service.app.state.settings.storage_url
    folder = f"{storage}/runs/{run.id}/checkpoints/ep1-ba100"
    Path(folder.removeprefix("file://")).mkdir(parents=True)
    Path(folder.removeprefix("file://"), "COMMITTED").write_text("{}")
    repo.add_checkpoint(run.id, CheckpointReport(step=100, epoch=1, time=now, bytes=3 * 2**20, committed=True,
                                                 url=folder, world_size=2))
    repo.add_checkpoint(run.id, CheckpointReport(step=200, epoch=2, time=now, committed=False, world_size=2,
                                                 url="file:///tmp/ckpt/ba200", error="OSError: disk full"))
    rows = page.locator("#checkpoints tbody tr")
    expect(rows).to_have_count(2, timeout=15_000)  # on the events' cadence
    expect(rows.nth(0)).to_contain_text("✓ committed")
    expect(rows.nth(0)).to_contain_text("3.0 MB")
    expect(rows.nth(0)).to_contain_text(folder)
    expect(rows.nth(1)).to_contain_text("✕ failed: OSError: disk full")
    # No empty error box beside the model's buttons, nor anywhere: one shows only with a message.
    expect(page.locator(".field-error:visible")).to_have_count(0)
    page.evaluate("document.querySelector('main').append(Object.assign(document.createElement('p'), "
                  "{className: 'field-error', id: 'empty-error-probe'}))")
    expect(page.locator("#empty-error-probe")).to_be_hidden()

    # Export the committed checkpoint's model (a Ray job would write the file), then download it.
    rows.nth(0).locator('[data-action="export-model"]').click()
    expect(rows.nth(0)).to_contain_text("exporting…")
    exported = Path(export_url(storage, run.id, 100, "safetensors").removeprefix("file://"))
    exported.write_bytes(b"the weights")
    download_button = rows.nth(0).locator('[data-action="download-model"]')
    expect(download_button).to_be_visible(timeout=15_000)  # on the checkpoints' cadence
    with page.expect_download() as download:
        download_button.click()
    assert download.value.suggested_filename == f"{run.id}-step-100.safetensors"
    assert Path(download.value.path()).read_bytes() == b"the weights"

    # At 800 px a long location keeps its row readable: a few lines at most (it wrapped into 6 to 8),
    # the whole URL in its title.
    page.set_viewport_size({"width": NARROW, "height": 900})
    page.wait_for_function(f"document.documentElement.clientWidth === {NARROW}")
    location = rows.nth(0).locator("td.location")
    expect(location.locator("code")).to_have_attribute("title", folder)
    lines = location.evaluate("""td => {  // the lines its text is laid out on
        const range = document.createRange();
        range.selectNodeContents(document.createTreeWalker(td, NodeFilter.SHOW_TEXT).nextNode());
        return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size; }""")
    assert 1 <= lines <= 3, f"the location takes {lines} lines: {folder}"


def test_runs_page_sends_one_conditional_request_per_poll_and_filters_by_status(page, local_service):
    repo = local_service.repo
    done = make_run(repo, "filter-done", status=RunStatus.COMPLETED)
    make_run(repo, "filter-queued", status=RunStatus.QUEUED)
    page.goto(dashboard_url(local_service.url, "runs"))
    expect(page.locator(f'tr[data-run-id="{done.id}"]')).to_be_visible()

    page.select_option("#status-filter", "COMPLETED")
    expect(page).to_have_url(re.compile(r"#/runs\?status=COMPLETED$"))
    rows = page.locator("#runs-table tbody tr")
    expect(rows.first).to_have_attribute("data-status", "COMPLETED")
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.status)")) == {"COMPLETED"}
    expect(page.locator(f'tr[data-run-id="{done.id}"] .badge')).to_have_text("✓ COMPLETED")

    statuses: list[tuple[str, int]] = []
    page.on("response", lambda r: statuses.append((r.url, r.status)) if "/api/" in r.url else None)
    window_s = 3.0
    page.wait_for_timeout(window_s * 1000)
    assert statuses, "the page stopped polling"
    assert all("/api/v1/runs?limit=100&status=COMPLETED" in url for url, _ in statuses)
    assert len(statuses) <= window_s * 1000 / POLL_MS + 1, f"{len(statuses)} requests in {window_s}s"
    assert {code for _, code in statuses} == {304}, "an unchanged list must be answered 304"


def test_archived_runs_and_sweeps_are_hidden_until_the_filter_asks_for_them(page, local_service):
    from api.sweeps import SweepSpec

    repo, sweeps = local_service.repo, local_service.app.state.sweeps
    kept, hidden = make_run(repo, "kept-run"), make_run(repo, "archived-run", status=RunStatus.COMPLETED)
    repo.set_archived(hidden.id, True)
    page.goto(dashboard_url(local_service.url, "runs"))
    expect(page.locator(f'tr[data-run-id="{kept.id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-run-id="{hidden.id}"]')).to_have_count(0)
    page.select_option("#archived-filter", "true")
    expect(page).to_have_url(re.compile(r"#/runs\?archived=true$"))
    expect(page.locator(f'tr[data-run-id="{hidden.id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-run-id="{kept.id}"]')).to_have_count(0)

    spec = SweepSpec.model_validate({"name": "archived-sweep", "base": EXAMPLE,
                                     "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
    archived_sweep = sweeps.create_sweep(spec, driver="external", token="t", project="default")
    sweeps.set_archived(archived_sweep.id, True)
    page.goto(dashboard_url(local_service.url, "sweeps"))
    expect(page.locator("#sweeps-count")).to_contain_text("sweep")  # the list has loaded
    expect(page.locator(f'tr[data-sweep-id="{archived_sweep.id}"]')).to_have_count(0)
    page.select_option("#sweeps-archived-filter", "all")
    expect(page).to_have_url(re.compile(r"#/sweeps\?archived=all$"))
    expect(page.locator(f'tr[data-sweep-id="{archived_sweep.id}"]')).to_be_visible()


def test_the_project_switcher_scopes_the_runs_and_sweeps_pages(page, local_service):
    from api.sweeps import SweepSpec

    project = f"switch-{time.monotonic_ns() % 10**8}"
    local_service.app.state.access.create_project(project)
    repo, sweeps = local_service.repo, local_service.app.state.sweeps
    inside = repo.create_run(RunSpec.model_validate({**EXAMPLE, "name": "in-project"}), project=project)
    outside = make_run(repo, "in-default")
    spec = SweepSpec.model_validate({"name": "project-sweep", "base": EXAMPLE,
                                     "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
    mine = sweeps.create_sweep(spec, driver="external", token="t", project=project)
    other = sweeps.create_sweep(spec, driver="external", token="t", project="default")
    sweep_lists = api_requests(page, "/api/v1/sweeps?")

    page.goto(dashboard_url(local_service.url, "sweeps"))
    expect(page.locator(f'tr[data-sweep-id="{other.id}"]')).to_be_visible()  # all projects at first
    expect(page.locator(f'tr[data-sweep-id="{mine.id}"]')).to_be_visible()
    page.select_option("#project", project)
    expect(page.locator(f'tr[data-sweep-id="{other.id}"]')).to_have_count(0)
    expect(page.locator(f'tr[data-sweep-id="{mine.id}"]')).to_be_visible()
    assert f"project={project}" in sweep_lists[-1], sweep_lists[-1]  # the list asked for the project
    page.select_option("#project", "")  # back to a list seen before: its first answer is a 304, still shown
    expect(page.locator(f'tr[data-sweep-id="{other.id}"]')).to_be_visible()

    page.select_option("#project", project)
    page.goto(dashboard_url(local_service.url, "runs"))  # the tab keeps the choice for the runs page too
    expect(page.locator(f'tr[data-run-id="{inside.id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-run-id="{outside.id}"]')).to_have_count(0)
    page.select_option("#project", "")
    expect(page.locator(f'tr[data-run-id="{outside.id}"]')).to_be_visible()
    page.select_option("#project", project)
    expect(page.locator(f'tr[data-run-id="{inside.id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-run-id="{outside.id}"]')).to_have_count(0)


def test_a_failing_api_turns_the_badge_stale_backs_off_and_recovers(page, local_service):
    run = make_run(local_service.repo, "outage")
    page.goto(dashboard_url(local_service.url, "runs"))
    live = page.locator("#live")
    expect(live).to_have_attribute("data-state", "live")
    row = page.locator(f'tr[data-run-id="{run.id}"]')
    expect(row).to_be_visible()

    failures: list[float] = []

    def fail(route):
        failures.append(time.monotonic())
        route.fulfill(status=503, body='{"detail": "down for a moment"}', content_type="application/json")

    page.route(re.compile(r"/api/v1/runs\?"), fail)
    expect(live).to_have_attribute("data-state", "stale")
    expect(live).to_contain_text("Stale")
    expect(row).to_be_visible()  # the last good data stays on screen
    page.wait_for_function("() => true")  # let queued route events reach Python
    deadline = time.monotonic() + 20
    while len(failures) < 4 and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert len(failures) >= 4, f"only {len(failures)} retries in 20 s"
    gaps = [b - a for a, b in zip(failures, failures[1:])]
    assert gaps[1] > 1.5 * gaps[0] and gaps[2] > 1.5 * gaps[1], f"no backoff between retries: {gaps}"
    save_screenshot(page, "runs-stale-1280", full_page=False)

    page.unroute(re.compile(r"/api/v1/runs\?"))
    expect(live).to_have_attribute("data-state", "live", timeout=20_000)
    expect(live).to_contain_text("Live")


def test_algorithms_page_renders_every_method_card_and_is_reached_by_keyboard(page, local_service):
    page.goto(dashboard_url(local_service.url, "runs"))
    expect(page.locator("h1")).to_have_text("Runs")
    for _ in range(8):  # Tab through the skip link and the navigation to "Algorithms"
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Algorithms":
            break
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"#/algorithms$"))
    expect(page.locator('[data-nav="algorithms"]')).to_have_attribute("aria-current", "page")

    for name, info in api_catalog.ALGORITHMS.items():
        article = page.locator(f"#algorithm-{name}")
        expect(article.locator("h2")).to_contain_text(info.title)
        expect(article).to_contain_text(f"maturity: {info.maturity}")
        pixels = article.locator(".chip", has_text="works on image pixels")
        expect(pixels).to_have_count(1 if info.needs_images else 0)
        card = article.locator(f'[data-card="{name}"]')
        expect(card).not_to_have_attribute("aria-busy", "true")
        readme = CARDS.joinpath(card_file_name(name))
        if readme.is_file():
            sections = re.findall(r"^## (.+)$", readme.read_text(), flags=re.M)
            assert sections, f"{readme} has no sections"
            # The markdown became headings, not text with '##' in it.
            expect(card.locator("h4").first).to_have_text(sections[0].strip())
            assert "##" not in card.inner_text()
        else:
            expect(card).to_contain_text("No method card yet.")
    params = page.locator("#algorithm-cutmix dl.params")
    expect(params).to_contain_text("alpha")
    save_screenshot(page, "algorithms-1280")
    assert_fits_width(page, NARROW)
    save_screenshot(page, "algorithms-800")


def test_submit_form_places_errors_on_their_lines_for_json_and_yaml_syntax(page, local_service):
    page.goto(dashboard_url(local_service.url, "submit"))
    body = {**EXAMPLE, "name": "json-spec", "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 1.5}}
    text = json.dumps(body, indent=2)
    momentum_line = next(i for i, line in enumerate(text.splitlines(), 1) if '"momentum"' in line)
    page.fill("#spec-text", text)
    page.click("#submit-run")
    note = page.locator('.field-error[data-field="optimizer.momentum"]')
    expect(note).to_contain_text("optimizer.momentum: Input should be less than 1 (got 1.5)")
    expect(note).to_have_attribute("data-line", str(momentum_line))
    expect(page.locator("#spec-text")).to_have_attribute("aria-invalid", "true")

    page.fill("#spec-text", "name: broken\nmodel: {name: simple_cnn\ndata: {}\n")
    page.click("#submit-run")
    syntax = page.locator("#problems .field-error").first
    expect(syntax).to_contain_text("not valid YAML")
    expect(page.locator("#problems h2")).to_have_text("The spec could not be read: 1 problem")

    # "edit line N" puts the caret on the line the error is about.
    page.fill("#spec-text", "name: x\nmodel: {name: simple_cnn}\nbogus: 1\n")
    page.click("#submit-run")
    page.locator('.field-error[data-field="bogus"] button').click()
    selected = page.evaluate("(() => { const t = document.querySelector('#spec-text');"
                             " return t.value.slice(t.selectionStart, t.selectionEnd); })()")
    assert selected == "bogus: 1"


SWEEP_EXAMPLE_FILE = Path(__file__).parents[2] / "examples" / "digits_sweep.yaml"


def test_a_sweep_submitted_from_the_form_opens_its_page(page, local_service):
    page.goto(dashboard_url(local_service.url, "submit"))
    expect(page.locator("#kind-run")).to_be_checked()  # an empty form starts as a run
    page.check("#kind-sweep")
    expect(page.locator("h1")).to_have_text("Submit a sweep")
    expect(page.locator("label[for=spec-text]")).to_have_text("SweepSpec (YAML or JSON)")
    page.click("#load-example")
    assert yaml.safe_load(page.input_value("#spec-text")) == yaml.safe_load(SWEEP_EXAMPLE_FILE.read_text())
    expect(page.locator("#submit-run")).to_have_text("Submit sweep")
    page.click("#submit-run")
    expect(page).to_have_url(re.compile(r"#/sweeps/[0-9a-f]+$"))
    sweep_id = page.url.rsplit("/", 1)[1]
    expect(page.locator("h1")).to_contain_text(sweep_id)
    sweep = local_service.app.state.sweeps.sweep_view(sweep_id)
    assert sweep.name == "digits-recipes" and sweep.status.value == "QUEUED"


def test_a_refused_sweep_shows_each_problem_next_to_its_line(page, local_service):
    page.goto(dashboard_url(local_service.url, "submit"))
    # A SweepSpec uploaded as a file: the choice follows its top-level keys (the form was on Run).
    text = (SWEEP_EXAMPLE_FILE.read_text()
            .replace("lr: 0.1, momentum", "lr: -0.1, momentum")
            .replace("max_size: 1}", "max_size: 1, required: [cutmix]}"))
    page.set_input_files("#spec-file", files=[{"name": "sweep.yaml", "mimeType": "text/yaml", "buffer": text.encode()}])
    expect(page.locator("#kind-sweep")).to_be_checked()
    page.click("#submit-run")
    line_of = {needle: next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)
               for needle in ("lr: -0.1", "algorithms: {pool", "optimizer.lr: {grid")}
    lr = page.locator('.field-error[data-field="base.optimizer.lr"]')
    expect(lr).to_contain_text("base.optimizer.lr: Input should be greater than 0 (got -0.1)")
    expect(lr).to_have_attribute("data-line", str(line_of["lr: -0.1"]))
    required = page.locator('.field-error[data-field="search.algorithms.required"]')
    expect(required).to_have_attribute("data-line", str(line_of["algorithms: {pool"]))
    expect(page.locator("#problems h2")).to_have_text("The API refused the sweep: 2 problems")
    expect(page).to_have_url(re.compile(r"#/submit$"))

    # A searched value the base refuses: named by its key, which has a dot in it.
    text = SWEEP_EXAMPLE_FILE.read_text().replace("{grid: [0.05, 0.1]}", "{grid: [0.05, -0.1]}")
    page.fill("#spec-text", text)
    page.click("#submit-run")
    grid = page.locator(""".field-error[data-field="search.params['optimizer.lr']"]""")
    expect(grid).to_contain_text("value -0.1 is not allowed")
    expect(grid).to_have_attribute("data-line", str(line_of["optimizer.lr: {grid"]))
    expect(grid).not_to_contain_text("the field is missing here")  # its own line, not its parent's
    save_screenshot(page, "submit-sweep-error-1280")
    assert_fits_width(page, NARROW)
    save_screenshot(page, "submit-sweep-error-800")


def test_typing_never_flips_the_kind_but_a_note_says_when_the_text_disagrees(page, local_service):
    page.goto(dashboard_url(local_service.url, "submit"))
    page.check("#kind-run")
    page.fill("#spec-text", SWEEP_EXAMPLE_FILE.read_text())
    expect(page.locator("#kind-run")).to_be_checked()
    expect(page.locator("#kind-note")).to_contain_text("looks like a SweepSpec")
    page.check("#kind-sweep")
    expect(page.locator("#kind-note")).to_be_hidden()
    page.reload()  # the draft and what it is stay with the tab
    expect(page.locator("#kind-sweep")).to_be_checked()


def test_the_submit_forms_field_paths_are_the_apis(page, local_service):
    """spec_source.js names each place in the text as the API's 422 names a field
    (api.validation_errors.join_field), keys with dots or quotes in brackets."""
    from api.validation_errors import join_field

    keys = ["optimizer.lr", "plain", "it's", 'say "hi"', "both ' and \"", "1", "back\\slash", "two words"]
    body = {"search": {"params": {key: {"grid": [1, 2]} for key in keys}}}
    fields = [join_field(("search", "params", key, "grid", 1)) for key in keys]
    page.goto(dashboard_url(local_service.url, "algorithms"))  # any page: the module is imported on its own
    for text in (yaml.safe_dump(body), json.dumps(body, indent=2)):
        located = page.evaluate("""async ([text, fields]) => {
            const { fieldLines, locateField } = await import('/static/js/spec_source.js');
            const lines = fieldLines(text);
            return fields.map((field) => locateField(lines, field)); }""", [text, fields])
        assert all(where and where["exact"] for where in located), list(zip(fields, located))
        key, missing = page.evaluate("""async ([text, fields]) => {
            const { fieldLines, locateField } = await import('/static/js/spec_source.js');
            return fields.map((field) => locateField(fieldLines(text), field)); }""",
            [text, [join_field(("search", "params", "it's")), join_field(("search", "params", "it's", "uniform"))]])
        assert missing == {"line": key["line"], "exact": False}  # a missing field: its parent's line


def test_edit_and_resubmit_opens_the_submit_form_with_the_runs_spec(page, local_service):
    run = make_run(local_service.repo, "resubmit-me", status=RunStatus.COMPLETED)
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    expect(page.locator("#cancel-run")).to_be_hidden()  # a finished run cannot be cancelled
    page.click("#edit-resubmit")
    expect(page).to_have_url(re.compile(r"#/submit$"))
    assert yaml.safe_load(page.input_value("#spec-text")) == run.spec


@pytest.mark.parametrize("width", [WIDE, NARROW])
def test_every_page_fits_the_window_without_horizontal_scrolling(page, local_service, width):
    run = make_run(local_service.repo, f"fits-{width}", algorithms=EXAMPLE["algorithms"])
    add_losses(local_service.repo, run.id, range(1, 21))
    page.set_viewport_size({"width": width, "height": 900})
    ready = {  # what shows once each page has its data
        "runs": page.locator(f'tr[data-run-id="{run.id}"]'),
        f"runs/{run.id}": page.locator('#chart-loss[data-points="20"]'),
        "algorithms": page.locator('[data-card="cutmix"]:not([aria-busy])'),
        "submit": page.locator(".catalog-names h2"),
    }
    for route, shown in ready.items():
        page.goto(dashboard_url(local_service.url, route))
        expect(shown).to_be_visible()
        assert_fits_width(page, width)
        # No JavaScript value leaked into the page as a text of its own (the spec's YAML may say null).
        leaked = page.evaluate("""(() => {
            const walker = document.createTreeWalker(document.querySelector('main'), NodeFilter.SHOW_TEXT);
            const bad = [];
            for (let node = walker.nextNode(); node; node = walker.nextNode()) {
              if (node.parentElement.closest('pre, textarea, code')) continue;
              const text = node.textContent;
              if (/^\\s*(null|undefined|NaN)\\s*$|\\[object Object\\]/.test(text)) bad.push(text);
            }
            return bad; })()""")
        assert leaked == [], f"{route}: {leaked}"


def drag_across(page, selector: str, start: float, end: float) -> None:
    """Drag the mouse across the chart under `selector` from `start` to `end` (fractions of its
    plot's width): how a user zooms a uPlot chart to a range of steps."""
    box = page.locator(f"{selector} .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * end, y, steps=5)
    page.mouse.up()


def test_a_zoomed_chart_says_so_and_keeps_its_zoom_when_a_key_moves_to_a_chart_of_its_own(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "eval-zoom")
    now = datetime.now(timezone.utc)
    count_key = "eval/errors_per_class_3"
    repo.add_metrics(run.id, [ReportedMetric(step=step, key=key, value=value, time=now) for step in range(10, 101, 10)
                              for key, value in (("eval/f1_macro", step / 200), (count_key, 0))])
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    scores = page.locator("#chart-eval-metrics")
    expect(scores).to_have_attribute("data-points", "20")
    note = scores.locator(".chart-zoom")
    expect(note).to_be_hidden()

    drag_across(page, "#chart-eval-metrics", 0.3, 0.6)
    expect(note).to_be_visible()
    zoomed = re.fullmatch(r"Zoomed to step (\d+)–(\d+); double-click the chart to see it all\.", note.inner_text())
    assert zoomed and 10 < int(zoomed[1]) < int(zoomed[2]) < 100, note.inner_text()  # steps whole
    # The count leaves the chart, which is drawn anew without it: on the range the user chose.
    repo.add_metrics(run.id, [ReportedMetric(step=110, key=key, value=value, time=datetime.now(timezone.utc))
                              for key, value in (("eval/f1_macro", 0.55), (count_key, 40))])
    expect(page.locator(f'figure.chart[data-key="{count_key}"]')).to_have_attribute("data-points", "11")
    expect(scores).to_have_attribute("data-points", "11")
    expect(note).to_be_visible()
    expect(note).to_have_text(zoomed[0])
    scores.locator(".u-over").dblclick()  # uPlot's reset, which the note tells of
    expect(note).to_be_hidden()
