"""Finding and comparing runs in a real browser: tick runs in the runs table, compare them
(overlaid curves, the spec fields that differ, summaries side by side), and the JS spec diff
gives the same dotted paths as ``api.spec_diff``; tags and notes edited on the run page."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from playwright.sync_api import expect

from api.spec_diff import spec_diff
from api.views import ReportedMetric, RunStatus
from tests.dashboard.conftest import dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_pages import drag_across, make_run


def _report(repo, run_id: str, final_accuracy: float, *, batches: int = 20) -> None:
    """``batches`` steps, a point a second from now on; the eval at each quarter."""
    start = datetime.now(timezone.utc)
    at = [start + timedelta(seconds=s - 1) for s in range(batches + 1)]
    points = [ReportedMetric(step=s, key="train/loss", value=2.0 / (1 + s * final_accuracy), time=at[s])
              for s in range(1, batches + 1)]
    points += [ReportedMetric(step=s, key="eval/accuracy", value=final_accuracy * s / batches, time=at[s])
               for s in range(batches // 4, batches + 1, batches // 4)]
    # The bookkeeping a real run reports beside them (README, "Metric keys").
    points += [ReportedMetric(step=s, key=key, value=value, time=at[s]) for s in range(1, batches + 1)
               for key, value in (("time/batch", s), ("time/epoch", s // 10), ("time/progress", s / batches),
                                  ("lr", 0.1 / s), ("throughput/samples_per_sec", 900.0 + s))]
    points.append(ReportedMetric(step=batches, key="checkpoint/final_saved", value=1.0, time=at[batches]))
    repo.add_metrics(run_id, points)


BOOKKEEPING = ["checkpoint/final_saved", "lr", "time/batch", "time/epoch", "time/progress"]


# Edge cases both diffs must agree on: a longer list, a missing key, an empty dict, true vs 1.
# A null where the other has fields below it (code: null vs code: {digest}) is those fields' rows only.
TRICKY = ({"a": [1, 2], "b": {"c": True}, "e": {}, "f": 1.5, "g": None},
          {"a": [1, 2, 3], "b": {"c": 1}, "d": None, "e": {"x": 0}, "f": 1.5, "g": {"h": "x"}})


def test_compare_page_overlays_curves_and_shows_the_spec_fields_that_differ(page, local_service):
    repo = local_service.repo
    a = make_run(repo, "compare-sgd", seed=1)
    b = make_run(repo, "compare-adam", seed=2, optimizer={"name": "adamw", "lr": 0.001},
                 algorithms=[{"name": "channels_last"}])
    for run, accuracy in ((a, 0.8), (b, 0.9)):
        _report(repo, run.id, accuracy)
        repo.transition(run.id, RunStatus.COMPLETED)

    page.goto(dashboard_url(local_service.url, "runs?name=compare-"))
    rows = page.locator("#runs-table tbody tr")
    expect(rows).to_have_count(2)
    compare = page.locator("#compare-runs")
    expect(compare).to_be_disabled()
    for run in (a, b):
        page.locator(f'tr[data-run-id="{run.id}"] .select-run').check()
    expect(compare).to_be_enabled()
    compare.click()
    expect(page).to_have_url(f"{local_service.url}/?poll_ms=500#/compare?ids={a.id},{b.id}")

    for key in ("eval/accuracy", "train/loss"):  # one chart per key, both runs' points on it
        expected = "8" if key == "eval/accuracy" else "40"
        expect(page.locator(f'figure[data-key="{key}"]')).to_have_attribute("data-points", expected)
    expect(page.locator('figure[data-key="train/loss"] canvas')).to_have_count(1)
    # What training measured comes first; the bookkeeping keys wait behind "show all".
    shown = page.locator("#compare figure.chart:visible")
    expect(shown).to_have_count(3)
    assert shown.evaluate_all("fs => fs.map(f => f.dataset.key)") == [
        "eval/accuracy", "train/loss", "throughput/samples_per_sec"]
    for key in BOOKKEEPING:
        expect(page.locator(f'figure[data-key="{key}"]')).to_be_hidden()
    page.locator("#compare-all-keys summary").click()
    expect(shown).to_have_count(3 + len(BOOKKEEPING))
    expect(page.locator('figure[data-key="lr"] canvas')).to_have_count(1)
    # Summaries: the metrics first, with their best; a bookkeeping key's "best" means nothing, so it has none.
    summary_keys = page.locator("#compare-summary tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert summary_keys == ["eval/accuracy", "train/loss", "throughput/samples_per_sec", *BOOKKEEPING]
    expect(page.locator('#compare-summary tr[data-key="train/loss"] td').first).to_contain_text("best")
    for key in BOOKKEEPING:
        cells = page.locator(f'#compare-summary tr[data-key="{key}"] td')
        expect(cells.first).to_contain_text("latest")
        expect(cells.first).not_to_contain_text("best")
    expect(page.locator('#compare-summary tr[data-key="time/progress"] td').first).to_have_text("1 latest")
    paths = page.locator("#spec-diff tbody tr").evaluate_all("rows => rows.map(r => r.dataset.path)")
    specs = [repo.get_run(run.id).spec for run in (a, b)]
    assert paths == list(spec_diff(*specs)) and "seed" in paths and "optimizer.name" in paths
    expect(page.locator('#compare-summary tr[data-key="eval/accuracy"] td').first).to_contain_text("0.8")
    save_screenshot(page, "compare-1280", full_page=False)

    js = page.evaluate("async (specs) => Object.keys((await import('/static/js/compare.js')).specDiff(specs))",
                       list(TRICKY))
    assert js == list(spec_diff(*TRICKY)) == ["a.2", "b.c", "e", "e.x", "g.h"]  # d: null or absent, the same

    page.goto(dashboard_url(local_service.url, f"compare?ids={a.id}"))
    expect(page.locator(".error-box")).to_contain_text("Pick 2 to 8 runs")


def test_runs_of_other_lengths_line_up_by_progress_or_wall_time(page, local_service):
    repo = local_service.repo
    short, long = make_run(repo, "short-run"), make_run(repo, "long-run", seed=3)
    _report(repo, short.id, 0.8, batches=20)
    _report(repo, long.id, 0.9, batches=40)  # twice the steps: by step, its curve runs twice as far
    repo.add_metrics(long.id, [ReportedMetric(step=40, key="eval/f1_macro", value=0.9,
                                              time=datetime.now(timezone.utc))])  # a key of the long run only
    page.goto(dashboard_url(local_service.url, f"compare?ids={short.id},{long.id}"))
    latest = page.locator('figure[data-key="train/loss"] .chart-latest')
    expect(latest).to_contain_text("@ step 20")
    expect(latest).to_contain_text("@ step 40")
    # A run keeps its colour on a chart the other run has no points on: the second run's, not the first's.
    expect(page.locator('figure[data-key="eval/f1_macro"] canvas')).to_have_count(1)
    markers = ("fig => [...fig.querySelectorAll('.u-series .u-marker')].slice(1)"
               ".map(m => getComputedStyle(m).borderColor)")
    assert page.locator('figure[data-key="eval/f1_macro"]').evaluate(markers) == ["rgb(194, 65, 12)"]  # #c2410c
    assert page.locator('figure[data-key="train/loss"]').evaluate(markers) == ["rgb(31, 95, 191)", "rgb(194, 65, 12)"]
    page.locator("#compare-x").select_option("progress")
    expect(page).to_have_url(f"{local_service.url}/?poll_ms=500#/compare?ids={short.id},{long.id}&x=progress")
    expect(page.locator('figure[data-key="train/loss"]')).to_have_attribute("data-x", "progress")
    expect(latest).to_have_text(re.compile(r"^short-run \(\w+\) \S+ @ progress 1 · long-run \(\w+\) \S+ @ progress 1$"))
    expect(page.locator('figure[data-key="eval/accuracy"]')).to_have_attribute("data-points", "8")
    expect(page.locator("#compare-x-note")).to_have_count(0)  # both runs report time/progress
    # Zoomed on this axis, the note names it and writes fractions as numbers, not whole steps.
    drag_across(page, 'figure[data-key="train/loss"]', 0.3, 0.6)
    note = page.locator('figure[data-key="train/loss"] .chart-zoom')
    expect(note).to_be_visible()
    zoomed = re.fullmatch(r"Zoomed to progress (0\.\d+)–(0\.\d+); double-click the chart to see it all\.",
                          note.inner_text())
    assert zoomed and 0 < float(zoomed[1]) < float(zoomed[2]) < 1, note.inner_text()
    page.locator('figure[data-key="train/loss"] .u-over').dblclick()
    expect(note).to_be_hidden()
    page.goto(dashboard_url(local_service.url, f"compare?ids={short.id},{long.id}&x=time"))
    expect(page.locator("#compare-x")).to_have_value("time")
    expect(latest).to_contain_text("@ seconds 19")  # a point a second, the first at 0 s
    expect(latest).to_contain_text("@ seconds 39")


def test_tags_and_notes_are_edited_on_the_run_page_and_tag_chips_filter_the_list(page, local_service):
    run = make_run(local_service.repo, "notes-run", status=RunStatus.COMPLETED)
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    page.locator("#edit-notes-button").click()
    page.locator("#edit-tags").fill("baseline has:colon")
    page.locator("#edit-notes").fill("lr was too high")
    page.locator("#save-notes").click()
    expect(page.locator("#run-notes")).to_have_text("lr was too high")
    expect(page.locator("#run-tags .tag-chip")).to_have_text(["baseline", "has:colon"])
    page.locator("#edit-notes-button").click()
    page.locator("#edit-tags").fill("no!good")
    page.locator("#save-notes").click()
    expect(page.locator("#notes-error")).to_contain_text("no!good")  # the 422, word for word
    assert local_service.repo.get_run(run.id).tags == ["baseline", "has:colon"]

    page.goto(dashboard_url(local_service.url, "runs"))
    page.locator(f'tr[data-run-id="{run.id}"] .tag-chip', has_text="has:colon").click()
    expect(page.locator("#tag-note")).to_be_visible()
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
