"""The sweep pages, the runs table's sweep columns and the resume button in a real browser,
against a live service (`tessera serve`, PostgreSQL, a Ray head).

Nothing trains: the module drives two external-driver sweeps through the API exactly as
`workers.tune` does (register each trial, report RUNNING, metrics and COMPLETED with the
trial's run token, end a trial as stopped or failed), with pauses that make the wall times,
and so the Pareto frontier, come out the same every time.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest
from playwright.sync_api import expect

from api.client import ApiError, Client
from api.specs import RunSpec
from api.sweeps import trial_spec
from api.views import (
    MetricsReport, ReportedMetric, RunStatus, StatusReport, SweepStatus, SweepView, TrialEnd, TrialRegistration,
)
from tests.dashboard.conftest import NARROW, WIDE, assert_fits_width, dashboard_url, save_screenshot
from tests.e2e.test_vertical_slice import long_synthetic_spec

pytestmark = pytest.mark.integration

FRONTIER_RGB = (0xC2, 0x41, 0x0C)  # pareto.js FRONTIER_COLOR
COMPLETED_RGB = (0x1F, 0x5F, 0xBF)  # pareto.js COMPLETED_COLOR
LR_GRID = [0.05, 0.1]


def sweep_spec(name: str) -> dict:
    base = long_synthetic_spec(name, batches=40)
    return {
        "name": name,
        "base": base,
        "search": {
            # 4 valid sets x 2 learning rates = 8 trials; ema+swa and alibi are skipped, with reasons.
            "algorithms": {"sets": [[], ["label_smoothing"], ["channels_last"], ["label_smoothing", "channels_last"],
                                    ["ema", "swa"], ["alibi"]]},
            "params": {"optimizer.lr": {"grid": LR_GRID}},
        },
        "metric": "eval/accuracy",
        "mode": "max",
    }


@dataclass
class Trial:
    trial_id: str
    algorithms: list[str]
    lr: float
    run_id: str = ""
    token: str = ""


@dataclass
class DrivenSweep:
    """An external-driver sweep and its trials, keyed by trial id."""

    view: SweepView
    token: str
    trials: dict[str, Trial] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.view.id

    def run_id(self, trial_id: str) -> str:
        return self.trials[trial_id].run_id


def register(client: Client, sweep: DrivenSweep, trial: Trial) -> Trial:
    base = RunSpec.model_validate(sweep.view.spec["base"])
    params = {"optimizer.lr": trial.lr}
    spec = trial_spec(base, trial.algorithms, params, name=f"{sweep.view.name}-{trial.trial_id}")
    ticket = client.register_trial(sweep.id, sweep.token, TrialRegistration(
        trial_id=trial.trial_id, spec=spec.model_dump(mode="json"), params=params))
    trial.run_id, trial.token = ticket.run_id, ticket.token
    sweep.trials[trial.trial_id] = trial
    return trial


def report(client: Client, trial: Trial, accuracies: list[float]) -> None:
    """Evaluations spread evenly over the run: eval/accuracy and time/progress per step."""
    now = datetime.now(timezone.utc)
    points = []
    for i, accuracy in enumerate(accuracies, 1):
        step = 10 * i
        points += [ReportedMetric(step=step, key="eval/accuracy", value=accuracy, time=now),
                   ReportedMetric(step=step, key="time/progress", value=i / 4, time=now),
                   ReportedMetric(step=step, key="train/loss", value=1.5 / i, time=now)]
    client.report_metrics(trial.run_id, trial.token, MetricsReport(points=points))


def set_status(client: Client, trial: Trial, status: RunStatus) -> None:
    client.report_status(trial.run_id, trial.token, StatusReport(status=status))


def create_external_sweep(client: Client, name: str) -> DrivenSweep:
    view = client.create_sweep(sweep_spec(name), driver="external")
    assert view.driver_token, "an external-driver sweep comes with its driver's token"
    return DrivenSweep(view=view, token=view.driver_token)


@pytest.fixture(scope="module")
def sweep(live_service) -> DrivenSweep:
    """Five trials of `dash-sweep`, all ended: `fast` (0.7 after ~0.8 s), `best` (0.9, last 0.85,
    ~2 s), `slow` (0.8, ~3 s, registered twice as Tune does for a restarted trial: attempt 2),
    `stopped` (ended early by the scheduler at 0.5) and `failed` (no metric). Frontier: fast, best."""
    client = live_service.client()
    sweep = create_external_sweep(client, "dash-sweep")
    plan = [Trial("fast", [], LR_GRID[0]), Trial("best", ["label_smoothing"], LR_GRID[0]),
            Trial("slow", ["channels_last"], LR_GRID[1]), Trial("stopped", ["label_smoothing", "channels_last"],
                                                                 LR_GRID[1]),
            Trial("failed", ["channels_last"], LR_GRID[0])]
    for trial in plan:
        register(client, sweep, trial)
    register(client, sweep, sweep.trials["slow"])  # Tune restarted it: a new attempt of the same run
    started = time.monotonic()
    for trial in plan:
        set_status(client, trial, RunStatus.RUNNING)
    report(client, sweep.trials["fast"], [0.55, 0.7])
    report(client, sweep.trials["best"], [0.6, 0.9, 0.85])
    report(client, sweep.trials["slow"], [0.6, 0.8])
    report(client, sweep.trials["stopped"], [0.5])
    client.end_trial(sweep.id, sweep.token, "stopped", TrialEnd(outcome="stopped", message="ASHA: below the median"))
    client.end_trial(sweep.id, sweep.token, "failed", TrialEnd(outcome="failed", error="RuntimeError: worker died"))
    for trial_id, at_s in [("fast", 0.8), ("best", 2.0), ("slow", 3.0)]:
        time.sleep(max(0.0, started + at_s - time.monotonic()))
        set_status(client, sweep.trials[trial_id], RunStatus.COMPLETED)
    sweep.view = client.get_sweep(sweep.id)
    yield sweep
    try:
        client.cancel_sweep(sweep.id)
    except ApiError:  # already ended
        pass


@pytest.fixture(scope="module")
def other_sweep(live_service) -> DrivenSweep:
    """A second sweep with one RUNNING trial: it must not show in the first one's runs, and
    its cancel button is tried."""
    client = live_service.client()
    other = create_external_sweep(client, "other-sweep")
    trial = register(client, other, Trial("only", [], LR_GRID[0]))
    set_status(client, trial, RunStatus.RUNNING)
    report(client, trial, [0.4])
    yield other
    try:
        client.cancel_sweep(other.id)
    except ApiError:
        pass


def canvas_pixels(page, selector: str, rgb: tuple[int, int, int]) -> dict:
    """How many pixels of the canvas under `selector` have colour `rgb`, and their centre in
    page (CSS) coordinates."""
    return page.evaluate("""([selector, [r, g, b]]) => {
        const canvas = document.querySelector(selector);
        const { data, width, height } = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
        let count = 0, sx = 0, sy = 0;
        for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) {
            const i = 4 * (y * width + x);
            if (data[i + 3] > 200 && Math.abs(data[i] - r) < 8 && Math.abs(data[i + 1] - g) < 8
                && Math.abs(data[i + 2] - b) < 8) { count++; sx += x; sy += y; }
        }
        const box = canvas.getBoundingClientRect();
        const scale = canvas.width / box.width;
        return { count, x: count && box.left + sx / count / scale, y: count && box.top + sy / count / scale };
    }""", [selector, list(rgb)])


def trial_ids_in_table(page) -> list[str]:
    return page.locator("#trials-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.trialId)")


# --- the sweeps list -----------------------------------------------------------------------

def test_sweeps_page_lists_each_sweep_with_trials_done_and_its_best_metric(page, live_service, sweep, other_sweep):
    page.goto(dashboard_url(live_service.url, "runs"))
    page.get_by_role("link", name="Sweeps").click()
    expect(page).to_have_url(re.compile(r"#/sweeps$"))
    expect(page.locator('[data-nav="sweeps"]')).to_have_attribute("aria-current", "page")

    row = page.locator(f'#sweeps-table tr[data-sweep-id="{sweep.id}"]')
    expect(row.locator(".col-sweep a")).to_have_text("dash-sweep")
    expect(row.locator(".badge")).to_have_text("▶ RUNNING")
    expect(row.locator(".col-trials")).to_have_text("5/8")  # every registered trial ended; 8 in the search
    expect(row.locator(".col-best")).to_contain_text("0.9")
    expect(row.locator(".col-best")).to_contain_text("eval/accuracy (max)")
    expect(page.locator(f'#sweeps-table tr[data-sweep-id="{other_sweep.id}"] .col-trials')).to_have_text("0/8")

    row.locator(".col-sweep a").click()
    expect(page).to_have_url(re.compile(rf"#/sweeps/{sweep.id}$"))
    expect(page.locator("h1")).to_contain_text("dash-sweep")

    page.goto(dashboard_url(live_service.url, "sweeps/no-such-sweep"))
    expect(page.locator("h1")).to_have_text("Sweep not found")


# --- one sweep -----------------------------------------------------------------------------

def test_sweep_page_draws_a_point_per_trial_with_a_metric_and_the_apis_frontier(page, live_service, sweep):
    view = live_service.client().get_sweep(sweep.id)
    assert view.pareto == [sweep.run_id("fast"), sweep.run_id("best")], "the fixture's timings set the frontier"
    with_metric = [t for t in view.trials if t.metric is not None]
    assert len(with_metric) == 4  # fast, best, slow, stopped; `failed` never reported one

    answers: list[int] = []
    page.on("response", lambda r: answers.append(r.status) if r.url.endswith(f"/api/v1/sweeps/{sweep.id}") else None)
    log_asks: list[str] = []
    page.on("request", lambda r: log_asks.append(r.url) if "/api/v1/" in r.url and "/logs" in r.url else None)
    page.goto(dashboard_url(live_service.url, f"sweeps/{sweep.id}"))
    chart = page.locator("#pareto-chart")
    expect(chart).to_have_attribute("data-points", str(len(with_metric)))
    expect(chart).to_have_attribute("data-frontier", str(len(view.pareto)))
    expect(page.locator("#pareto-not-drawn")).to_have_text("1 trial without a metric yet (not drawn).")
    frontier = page.locator("#pareto-list li")
    expect(frontier).to_have_count(len(view.pareto))
    assert frontier.evaluate_all("items => items.map(i => i.dataset.runId)") == view.pareto
    expect(frontier.nth(1)).to_contain_text("best")  # the best run is marked in words

    # uPlot drew the frontier (its colour) and the dominated completed trial (`slow`, blue).
    expect(chart.locator("canvas")).to_have_count(1)
    assert canvas_pixels(page, "#pareto-chart canvas", FRONTIER_RGB)["count"] > 50
    assert canvas_pixels(page, "#pareto-chart canvas", COMPLETED_RGB)["count"] > 10

    facts = page.locator(".sweep-facts")
    expect(facts).to_contain_text("eval/accuracy (max: higher is better)")
    expect(facts.locator('[data-fact="trials"]')).to_have_text("5/8 done")
    expect(facts.locator('[data-fact="by-status"]')).to_contain_text("3 ✓ COMPLETED")
    expect(facts.locator('[data-fact="by-status"]')).to_contain_text("1 ⇥ STOPPED early")
    stopped = page.locator(f'#trials-table tr[data-run-id="{sweep.run_id("stopped")}"]')
    expect(stopped.locator(".badge")).to_have_text("⇥ STOPPED early")
    expect(stopped.locator(".col-metric")).to_have_text("0.5")
    expect(stopped.locator(".progress-label")).to_have_text("25%")
    slow = page.locator(f'#trials-table tr[data-run-id="{sweep.run_id("slow")}"]')
    expect(slow.locator(".col-params")).to_contain_text(f"optimizer.lr = {LR_GRID[1]}")
    expect(slow.locator(".chip")).to_have_text(["channels_last"])
    expect(slow.locator(".tags")).to_contain_text("1 restart")
    skipped = page.locator("#skipped .skipped-list > li")
    expect(skipped).to_have_count(2)
    expect(skipped.filter(has_text="swa")).to_contain_text("do not compose")
    expect(skipped.filter(has_text="alibi")).to_contain_text("text")

    # An external driver's output is not in Tessera: the log pane says so and never asks for it.
    expect(page.locator("#sweep-log-note")).to_contain_text("runs outside Tessera (driver: external)")
    expect(page.locator("#sweep-log")).to_be_hidden()

    page.wait_for_timeout(1500)  # a few polls of an unchanged sweep
    assert answers[0] == 200 and 304 in answers, f"the page must revalidate with its ETag: {answers}"
    assert log_asks == []
    save_screenshot(page, "sweep-1280", full_page=False)
    assert_fits_width(page, NARROW)
    save_screenshot(page, "sweep-800", full_page=False)
    page.set_viewport_size({"width": WIDE, "height": 900})


def test_trials_table_sorts_by_the_clicked_column_by_mouse_and_keyboard(page, live_service, sweep):
    page.goto(dashboard_url(live_service.url, f"sweeps/{sweep.id}"))
    expect(page.locator("#trials-table tbody tr")).to_have_count(5)
    metric_header = page.locator("#trials-table th.col-metric")

    metric_header.get_by_role("button").click()
    expect(metric_header).to_have_attribute("aria-sort", "ascending")
    assert trial_ids_in_table(page) == ["stopped", "fast", "slow", "best", "failed"]  # no metric: last
    metric_header.get_by_role("button").click()
    expect(metric_header).to_have_attribute("aria-sort", "descending")
    assert trial_ids_in_table(page) == ["best", "slow", "fast", "stopped", "failed"]

    wall = page.locator("#trials-table th.col-wall")
    expect(wall).to_have_attribute("title", re.compile("trained, its waits between attempts left out"))
    wall.get_by_role("button").focus()
    page.keyboard.press("Enter")
    expect(wall).to_have_attribute("aria-sort", "ascending")
    expect(metric_header).not_to_have_attribute("aria-sort", re.compile(".*"))
    ids = trial_ids_in_table(page)
    assert ids.index("fast") < ids.index("best") < ids.index("slow"), ids


def test_frontier_entries_and_chart_points_open_their_runs(page, live_service, sweep):
    page.goto(dashboard_url(live_service.url, f"sweeps/{sweep.id}"))
    first = page.locator("#pareto-list li a").first
    expect(first).to_have_text("dash-sweep-fast")
    first.focus()  # the frontier is reachable without a mouse
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(rf"#/runs/{sweep.run_id('fast')}$"))
    expect(page.locator(".page-head .badge")).to_have_text("✓ COMPLETED")
    expect(page.locator('[data-fact="sweep"] a')).to_have_attribute("href", f"#/sweeps/{sweep.id}")

    page.locator("#run-sweep-crumb").click()
    expect(page).to_have_url(re.compile(rf"#/sweeps/{sweep.id}$"))
    expect(page.locator("#pareto-chart")).to_have_attribute("data-points", "4")
    # The only plain blue point is `slow` (the frontier's own points are drawn over in orange).
    point = canvas_pixels(page, "#pareto-chart canvas", COMPLETED_RGB)
    assert point["count"] > 10
    page.mouse.move(point["x"], point["y"])
    expect(page.locator("#pareto-readout")).to_contain_text("dash-sweep-slow (COMPLETED)")
    page.mouse.click(point["x"], point["y"])
    expect(page).to_have_url(re.compile(rf"#/runs/{sweep.run_id('slow')}$"))


def test_a_failing_api_turns_the_sweep_page_stale_and_it_recovers(page, live_service, sweep):
    page.goto(dashboard_url(live_service.url, f"sweeps/{sweep.id}"))
    live = page.locator("#live")
    expect(live).to_have_attribute("data-state", "live")
    pattern = re.compile(rf"/api/v1/sweeps/{sweep.id}$")
    page.route(pattern, lambda route: route.fulfill(status=503, body='{"detail": "down"}',
                                                    content_type="application/json"))
    expect(live).to_have_attribute("data-state", "stale")
    expect(live).to_contain_text("retrying in")
    expect(page.locator("#pareto-list li")).to_have_count(2)  # the last good answer stays on screen
    page.unroute(pattern)
    expect(live).to_have_attribute("data-state", "live", timeout=20_000)


# --- the runs table ------------------------------------------------------------------------

def test_runs_page_filtered_by_a_sweep_lists_its_trials_with_best_metric_and_restarts(
        page, live_service, sweep, other_sweep):
    page.goto(dashboard_url(live_service.url, f"sweeps/{sweep.id}"))
    page.locator("#sweep-runs-link").click()
    expect(page).to_have_url(re.compile(rf"#/runs\?sweep_id={sweep.id}$"))
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(5)
    assert set(rows.evaluate_all("rows => rows.map(r => r.dataset.runId)")) == {
        t.run_id for t in sweep.trials.values()}
    expect(page.locator("#sweep-note")).to_contain_text("Trials of sweep dash-sweep")
    expect(page.locator("#sweep-filter")).to_have_value(sweep.id)

    best = page.locator(f'tr[data-run-id="{sweep.run_id("best")}"]')
    expect(best.locator(".col-best")).to_have_text("0.9eval/accuracy")  # best, not the last value
    expect(best.locator(".col-metric")).to_have_text("0.85eval/accuracy")
    expect(best.locator(".col-attempt")).to_have_text("1")
    expect(best.locator("a.sweep-link")).to_have_attribute("href", f"#/sweeps/{sweep.id}")
    expect(best.locator("a.sweep-link")).to_contain_text("trial best")
    expect(page.locator(f'tr[data-run-id="{sweep.run_id("slow")}"] .col-attempt')).to_have_text("2")
    expect(page.locator(f'tr[data-run-id="{sweep.run_id("stopped")}"] .badge')).to_have_text("⇥ STOPPED early")
    expect(page.locator(f'tr[data-run-id="{sweep.run_id("failed")}"] .col-best')).to_contain_text("–")

    page.select_option("#sweep-filter", "")  # all runs: the other sweep's trial too
    expect(page).to_have_url(re.compile(r"#/runs$"))
    expect(page.locator(f'tr[data-run-id="{other_sweep.run_id("only")}"]')).to_be_visible()
    page.select_option("#status-filter", "STOPPED")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run-id", sweep.run_id("stopped"))
    assert_fits_width(page, NARROW)


# --- resume --------------------------------------------------------------------------------

def test_resume_asks_for_confirmation_shows_the_apis_refusal_then_starts_the_next_attempt(page, live_service, sweep):
    client = live_service.client()
    run_id = sweep.run_id("failed")
    page.goto(dashboard_url(live_service.url, f"runs/{run_id}"))
    expect(page.locator(".page-head .badge")).to_have_text("✕ FAILED")
    resume = page.locator("#resume-run")
    dialog = page.locator("#resume-dialog")

    resume.click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("Attempt 2")
    page.get_by_role("button", name="Keep as is").click()
    expect(dialog).to_be_hidden()
    assert client.get_run(run_id).status is RunStatus.FAILED

    # 3 workers cannot split the batch of 32: the API refuses, the dialog says why and stays.
    resume.click()
    page.fill("#resume-workers", "3")
    page.locator("#confirm-resume").click()
    expect(page.locator("#resume-error")).to_contain_text("Could not resume: num_workers")
    expect(dialog).to_be_visible()
    assert client.get_run(run_id).status is RunStatus.FAILED

    page.fill("#resume-workers", "")
    page.keyboard.press("Enter")
    expect(dialog).to_be_hidden()
    expect(page.locator('[data-fact="attempt"]')).to_have_text("2")
    expect(page.locator(".page-head .badge")).to_have_text(re.compile(r"QUEUED|STARTING|RUNNING"))
    expect(page.locator('#events li[data-to="QUEUED"]').last).to_contain_text("resumed by key ")
    expect(resume).to_be_hidden()
    resumed = client.get_run(run_id)
    assert resumed.attempt == 2 and resumed.restarts == 1
    save_screenshot(page, "run-resumed-1280", full_page=False)

    # A resumed trial is an ordinary run now: stop it before it trains on the shared Ray head.
    # Not waited for here (stopping a Ray job that is still starting can take minutes on a
    # busy machine); the service fixture waits for every run to end before it stops.
    client.cancel_run(run_id)


# --- cancel --------------------------------------------------------------------------------

def test_cancel_asks_for_confirmation_then_cancels_the_sweep_and_its_running_trial(page, live_service, other_sweep):
    client = live_service.client()
    page.goto(dashboard_url(live_service.url, f"sweeps/{other_sweep.id}"))
    cancel = page.locator("#cancel-sweep")
    dialog = page.locator("#cancel-sweep-dialog")

    cancel.click()
    expect(dialog).to_contain_text("Cancel this sweep?")
    page.get_by_role("button", name="Keep running").click()
    expect(dialog).to_be_hidden()
    assert client.get_sweep(other_sweep.id).status is SweepStatus.RUNNING

    cancel.click()
    page.keyboard.press("Tab")  # focus starts on "Keep running"; the next button confirms
    expect(page.locator("#confirm-cancel-sweep")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".page-head .badge")).to_have_text("■ CANCELED")
    expect(cancel).to_be_hidden()
    trial_row = page.locator(f'#trials-table tr[data-run-id="{other_sweep.run_id("only")}"]')
    expect(trial_row.locator(".badge")).to_have_text("■ CANCELED", timeout=15_000)
    assert client.get_run(other_sweep.run_id("only")).status is RunStatus.CANCELED
