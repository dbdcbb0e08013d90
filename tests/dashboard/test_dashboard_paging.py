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
from tests.conftest import ADMIN_HEADERS
from tests.dashboard.conftest import NARROW, assert_fits_width, dashboard_url, save_screenshot
from tests.dashboard.test_dashboard_housekeeping import external_sweep, new_project
from tests.dashboard.test_dashboard_pages import api_requests, make_run

PAGE_SIZE = 100  # runs.js and sweeps.js ask for pages of this many


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns() % 10**9}"


def listed_ids(local_service, path: str) -> list[str]:
    """Every id the API lists at ``path`` (one page of up to 500), in its order: newest first."""
    answer = httpx.get(f"{local_service.url}/api/v1/{path}&limit=500", headers=ADMIN_HEADERS, timeout=30)
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


# --- PagedList itself, in the browser with a fake API ----------------------------------------
#
# The tests above drive the real pages, which poll every 500 ms: the re-read of the older pages
# every 5th poll happens inside expect's wait, so they cannot tell whether the first page's moved
# cursor alone keeps the older pages right. These import paging.js into a blank page of the
# service's origin and give PagedList a fake `get` (getIfChanged's contract: `{data, changed}`,
# and the very same object for an unchanged page) over a list held in the page, and an
# `olderEvery` no test reaches, so that each poll reads only what the moved cursor asks for.

HARNESS = """
async ({ total, limit }) => {
  const { PagedList, olderButton } = await import("/static/js/paging.js");
  // The fake API: items r1…rN, newest (highest) first; a cursor is the last item's number, and the
  // next page holds the items older than it (keyset paging, as the API pages).
  const api = {
    items: Array.from({ length: total }, (_, i) => ({ id: `r${total - i}`, n: total - i, status: "QUEUED" })),
    calls: [], last: new Map(), duplicate: false, failNext: null, gate: null,
  };
  api.add = (count) => {
    const top = Math.max(0, ...api.items.map((item) => item.n));
    for (let i = 1; i <= count; i += 1) api.items.unshift({ id: `r${top + i}`, n: top + i, status: "QUEUED" });
  };
  api.remove = (id) => { api.items = api.items.filter((item) => item.id !== id); };
  api.get = async (path) => {
    api.calls.push(path);
    if (api.gate) await api.gate;
    const cursor = new URLSearchParams(path.split("?")[1]).get("cursor");
    if (cursor !== null && api.failNext) {
      const error = new Error(api.failNext);
      api.failNext = null;
      throw error;
    }
    const after = api.items.filter((item) => cursor === null || item.n < Number(cursor));
    const data = after.slice(0, limit).map((item) => ({ ...item }));
    // A row repeated from the page before (as an API paging by offset would give while rows move).
    if (api.duplicate && cursor !== null) {
      const repeated = api.items.find((item) => item.n === Number(cursor));
      if (repeated) data.unshift({ ...repeated, status: "REPEATED" });
    }
    const page = { data, next_cursor: after.length > limit ? String(after[limit - 1].n) : null };
    const text = JSON.stringify(page);
    if (api.last.get(path)?.text === text) return { data: api.last.get(path).page, changed: false };
    api.last.set(path, { text, page });
    return { data: page, changed: true };
  };
  const list = new PagedList(`/runs?limit=${limit}`, { olderEvery: 1e9, get: api.get });
  // A table as runs.js keeps one: a row per item (a link in it), the button under it.
  const rows = document.createElement("ul");
  const render = () => {
    rows.replaceChildren(...list.items.map((item) => {
      const row = document.createElement("li");
      row.dataset.id = item.id;
      row.dataset.status = item.status;
      const link = document.createElement("a");
      link.href = `#${item.id}`;
      link.textContent = item.id;
      row.append(link);
      return row;
    }));
    older.update();
  };
  const older = olderButton(list, { id: "x-older", label: "Show older", noun: "runs", rows, render });
  document.body.append(rows, older.element);
  window.T = { api, list, render,
    // Each resolves to how many requests it made.
    poll: async () => { const n = api.calls.length; if (await list.poll()) render(); return api.calls.length - n; },
    older: async () => { const n = api.calls.length; await list.loadOlder(); render(); return api.calls.length - n; },
    ids: () => list.items.map((item) => item.id),
  };
}
"""


def paging_harness(page, local_service, *, total: int, limit: int):
    """A blank page of the service's origin with ``window.T``: the fake API, the list (not yet
    polled), a rendered table of its items with the "Show older" button under it."""
    blank = f"{local_service.url}/paging-harness"
    html = "<!doctype html><title>paging</title>"
    page.route(blank, lambda route: route.fulfill(content_type="text/html", body=html))
    page.goto(blank)
    page.evaluate(HARNESS, {"total": total, "limit": limit})


def ids(first: int, last: int) -> list[str]:
    """r<first> down to r<last>: a stretch of the fake API's list, newest first."""
    return [f"r{n}" for n in range(first, last - 1, -1)]


def test_new_items_that_shift_full_pages_keep_every_loaded_row_and_cost_one_request_per_page(page, local_service):
    paging_harness(page, local_service, total=9, limit=3)
    assert page.evaluate("T.poll()") == 1
    assert page.evaluate("T.older()") == 1
    assert page.evaluate("T.ids()") == ids(9, 4)  # two full pages

    assert page.evaluate("T.poll()") == 1  # nothing new: only the first page, revalidated
    # Two new items push r5 and r4 onto a third page: the chain reads on until r4, and no further.
    page.evaluate("T.api.add(2)")
    requests = page.evaluate("T.poll()")
    assert page.evaluate("T.ids()") == ids(11, 4)
    assert requests == 3
    assert page.evaluate("T.list.hasOlder") is True  # r3, on the third page, is not shown
    assert page.evaluate("T.poll()") == 1
    # One page's worth more: r4 is now on the fourth page.
    page.evaluate("T.api.add(3)")
    assert page.evaluate("T.poll()") == 4
    assert page.evaluate("T.ids()") == ids(14, 4)

    # "Show older" shows the rest of the last page read and the page after it.
    assert page.evaluate("T.older()") == 1
    assert page.evaluate("T.ids()") == ids(14, 1)
    assert page.evaluate("T.list.hasOlder") is False
    page.evaluate("T.api.add(2)")
    assert page.evaluate("T.poll()") == 6  # r1 moved onto a sixth page
    assert page.evaluate("T.ids()") == ids(16, 1)
    assert page.evaluate("T.list.hasOlder") is False


def test_when_the_oldest_row_shown_goes_the_view_ends_at_the_oldest_one_left(page, local_service):
    paging_harness(page, local_service, total=9, limit=3)
    page.evaluate("T.poll()")
    page.evaluate("T.older()")
    assert page.evaluate("T.ids()") == ids(9, 4)
    page.evaluate("T.api.remove('r4'); T.api.add(2)")  # archived, say, as two new ones came
    requests = page.evaluate("T.poll()")
    assert page.evaluate("T.ids()") == ids(11, 5)
    assert requests == 4  # r4 is looked for at most two pages further
    assert page.evaluate("T.poll()") == 1
    page.evaluate("T.api.add(1)")
    assert page.evaluate("T.poll()") == 3  # r5 now ends the view: found on the third page
    assert page.evaluate("T.ids()") == ids(12, 5)


def test_a_row_the_api_repeats_on_the_next_page_is_shown_once_in_its_newest_place(page, local_service):
    paging_harness(page, local_service, total=9, limit=3)
    page.evaluate("T.api.duplicate = true")  # each older page starts with the last row of the page before
    page.evaluate("T.poll()")
    page.evaluate("T.older()")
    assert page.evaluate("T.ids()") == ids(9, 4)
    page.evaluate("T.api.add(2)")
    page.evaluate("T.poll()")
    assert page.evaluate("T.ids()") == ids(11, 4)
    # The first (newest) copy is the one shown, in its place.
    statuses = page.locator("li").evaluate_all("rows => rows.map(r => r.dataset.status)")
    assert statuses == ["QUEUED"] * 8
    page.evaluate("T.older()")
    assert page.evaluate("T.ids()") == ids(11, 1)


def test_show_older_keeps_the_focus_on_the_button_until_nothing_older_is_left(page, local_service):
    paging_harness(page, local_service, total=7, limit=3)
    page.evaluate("T.poll()")
    button = page.locator("#x-older")
    expect(button).to_be_visible()
    button.focus()
    # The next page waits for T.release() (the `null`: evaluate would wait for a promise it is given).
    page.evaluate("T.api.gate = new Promise((resolve) => { T.release = resolve; }); null")
    page.keyboard.press("Enter")
    expect(button).to_have_text("Loading…")
    expect(button).to_have_attribute("aria-disabled", "true")
    assert page.evaluate("document.activeElement.id") == "x-older"
    page.keyboard.press("Enter")  # pressed again while it loads: ignored
    assert page.evaluate("T.api.calls.length") == 2
    page.evaluate("T.api.gate = null; T.release()")
    expect(page.locator("li")).to_have_count(6)
    expect(button).to_have_text("Show older")
    expect(button).not_to_have_attribute("aria-disabled", "true")
    assert page.evaluate("document.activeElement.id") == "x-older"  # more to load: the focus stays
    assert page.evaluate("T.api.calls.length") == 2

    page.keyboard.press("Enter")  # the last page: the button goes, the focus moves to its first row
    expect(page.locator("li")).to_have_count(7)
    expect(button).to_be_hidden()
    assert page.evaluate("document.activeElement.closest('li')?.dataset.id") == "r1"


def test_a_failed_older_page_says_why_and_leaves_the_button_to_try_again(page, local_service):
    paging_harness(page, local_service, total=7, limit=3)
    page.evaluate("T.poll()")
    button, problem = page.locator("#x-older"), page.locator("#x-older-error")
    expect(problem).to_be_hidden()
    page.evaluate("T.api.failNext = 'the service is down'")
    page.evaluate("T.api.gate = new Promise((resolve) => { T.release = resolve; }); null")
    button.focus()
    page.keyboard.press("Enter")
    expect(button).to_have_attribute("aria-disabled", "true")
    page.evaluate("T.api.gate = null; T.release()")  # the answer comes a while later: an error
    expect(problem).to_have_text("Could not load older runs: the service is down. Try again.")
    expect(problem).to_be_visible()
    expect(button).to_have_text("Show older")
    expect(page.locator("li")).to_have_count(3)
    assert page.evaluate("document.activeElement.id") == "x-older"

    page.keyboard.press("Enter")  # again, from the keyboard: it loads, and the line goes
    expect(page.locator("li")).to_have_count(6)
    expect(problem).to_be_hidden()
    assert page.evaluate("document.activeElement.id") == "x-older"
