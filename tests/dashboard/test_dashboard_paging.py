"""The runs and sweeps lists past their first page, in a real browser against the app over
SQLite (runs and sweeps written straight into its repositories): "Show older …" appends the next
page with the API's cursor and keeps the filters, the count says when older ones are not
loaded, new items shift the pages without a row shown twice, and a row on an older page stays
live; and the sweeps page's name filter, kept in the URL as the runs page keeps its own."""

from __future__ import annotations

import re
import time

import httpx
from playwright.sync_api import expect

from api.views import RunStatus
from tests.conftest import TEST_ADMIN_KEY
from tests.dashboard.conftest import NARROW, assert_fits_width, dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_housekeeping import external_sweep, new_project
from tests.dashboard.test_dashboard_pages import api_requests, make_run

PAGE_SIZE = 100  # runs.js and sweeps.js ask for pages of this many
HEADERS = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns() % 10**9}"


def listed_ids(local_service, path: str) -> list[str]:
    """Every id the API lists at ``path`` (one page of up to 500), in its order: newest first."""
    answer = httpx.get(f"{local_service.url}/api/v1/{path}&limit=500", headers=HEADERS, timeout=30)
    answer.raise_for_status()
    assert answer.json()["next_cursor"] is None, "the test lists more than one page of the API"
    return [item["id"] for item in answer.json()["data"]]


def shown_ids(page, table: str, attribute: str) -> list[str]:
    return page.locator(f"{table} tbody tr").evaluate_all(f"rows => rows.map(r => r.dataset.{attribute})")


def test_show_older_runs_appends_the_next_page_and_every_loaded_row_stays_live_and_shown_once(page, local_service):
    repo = local_service.repo
    name = unique("pager")
    for i in range(PAGE_SIZE + 5):  # QUEUED: created and nothing more, the cheapest run there is
        make_run(repo, f"{name}-{i:03d}", status=RunStatus.QUEUED)
    older_pages = api_requests(page, "cursor=")
    page.goto(dashboard_url(local_service.url, f"runs?name={name}"))

    rows, count, older = page.locator("#runs-table tbody tr"), page.locator("#runs-count"), page.locator("#runs-older")
    expect(rows).to_have_count(PAGE_SIZE)
    expect(count).to_have_text(re.compile(rf"^Newest {PAGE_SIZE} runs shown\b.*; older runs not loaded$"))
    expect(older).to_have_text("Show older runs")
    older.scroll_into_view_if_needed()
    save_screenshot(page, "runs-older-1280", full_page=False)
    older.click()
    expect(rows).to_have_count(PAGE_SIZE + 5)
    expect(older).to_be_hidden()  # the last page: nothing older
    expect(count).to_have_text(re.compile(rf"^{PAGE_SIZE + 5} runs, {PAGE_SIZE + 5} not finished$"))
    expected = listed_ids(local_service, f"runs?name={name}")
    assert shown_ids(page, "#runs-table", "runId") == expected
    # The button had the focus; it went away, so the focus is on the first run just loaded.
    assert page.evaluate("document.activeElement.closest('tr')?.dataset.runId") == expected[PAGE_SIZE]
    assert older_pages and all(f"name={name}" in url for url in older_pages), "the older page lost the filter"

    # Three new runs push three off the first page: each run is still shown, once, newest first.
    for i in range(3):
        make_run(repo, f"{name}-new-{i}", status=RunStatus.QUEUED)
    expect(rows).to_have_count(PAGE_SIZE + 8)
    expected = listed_ids(local_service, f"runs?name={name}")
    assert shown_ids(page, "#runs-table", "runId") == expected
    expect(count).to_have_text(re.compile(rf"^{PAGE_SIZE + 8} runs\b"))

    # The oldest run, on the second page, starts: its row says so without a reload.
    oldest = expected[-1]
    repo.begin_attempt(oldest, token="test-token")
    repo.transition(oldest, RunStatus.RUNNING)
    expect(page.locator(f'tr[data-run-id="{oldest}"]')).to_have_attribute("data-status", "RUNNING", timeout=15_000)
    assert shown_ids(page, "#runs-table", "runId") == expected


def test_show_older_sweeps_pages_the_sweeps_of_the_project_chosen(page, local_service):
    project = new_project(local_service)
    for i in range(PAGE_SIZE + 2):
        external_sweep(local_service, f"paged-{i:03d}", project=project)
    page.goto(dashboard_url(local_service.url, "sweeps"))
    page.select_option("#project", project)

    rows, count, older = page.locator("#sweeps-table tbody tr"), page.locator("#sweeps-count"), page.locator("#sweeps-older")
    expect(count).to_have_text(re.compile(rf"^Newest {PAGE_SIZE} sweeps shown\b.*; older sweeps not loaded$"))
    expect(rows).to_have_count(PAGE_SIZE)
    older.click()
    expect(rows).to_have_count(PAGE_SIZE + 2)
    expect(older).to_be_hidden()
    expect(count).to_have_text(re.compile(rf"^{PAGE_SIZE + 2} sweeps\b"))
    assert shown_ids(page, "#sweeps-table", "sweepId") == listed_ids(local_service, f"sweeps?project={project}")


def test_the_sweeps_name_filter_lists_the_matching_sweeps_and_lives_in_the_url(page, local_service):
    word = unique("needle")
    wanted = external_sweep(local_service, f"{word}-sweep")
    other = external_sweep(local_service, unique("haystack"))
    page.goto(dashboard_url(local_service.url, "sweeps"))
    expect(page.locator(f'tr[data-sweep-id="{other.id}"]')).to_be_visible()

    search = page.get_by_label("Search sweep names")
    search.fill(f"  {word.upper()} ")  # trimmed; the API matches any case
    search.press("Enter")
    expect(page).to_have_url(re.compile(rf"#/sweeps\?name={word.upper()}$"))
    expect(page.locator(f'tr[data-sweep-id="{wanted.id}"]')).to_be_visible()
    expect(page.locator(f'tr[data-sweep-id="{other.id}"]')).to_have_count(0)
    expect(page.locator("#sweeps-table tbody tr")).to_have_count(1)
    expect(search).to_have_value(word.upper())
    save_screenshot(page, "sweeps-name-filter-1280", full_page=False)
    assert_fits_width(page, NARROW)

    page.select_option("#sweeps-archived-filter", "all")  # the other filter keeps the name
    expect(page).to_have_url(re.compile(rf"#/sweeps\?name={word.upper()}&archived=all$"))
    expect(page.locator(f'tr[data-sweep-id="{wanted.id}"]')).to_be_visible()

    page.goto(dashboard_url(local_service.url, f"sweeps?name={word}-nothing"))  # a link to a filtered view
    expect(page.locator("#sweeps-empty")).to_have_text("No sweeps match these filters.")
    expect(page.locator("#sweeps-older")).to_be_hidden()
