"""Archive, unarchive and delete on the run and sweep pages, and which actions a key's role
shows there, in a real browser against the app over SQLite (runs and sweeps written straight
into its repositories): the role is the key's in the run's or sweep's own project, a viewer is
offered no action, and a trial that its sweep drives offers its sweep instead of "Cancel run…"."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from playwright.sync_api import expect

from api.specs import RunSpec
from api.sweeps import SweepSpec
from api.views import CheckpointReport, RunStatus
from tests.dashboard.conftest import (
    NARROW, WIDE, assert_fits_width, dashboard_url, page_with_key, save_screenshot,
)
from tests.dashboard.test_dashboard_pages import EXAMPLE, make_run

MEMBER_ACTIONS = ["#cancel-run", "#fork-run", "#edit-resubmit", "#archive-run", "#edit-notes-button",
                  '[data-action="export-model"]']


def external_sweep(local_service, name: str, project: str = "default"):
    spec = SweepSpec.model_validate({"name": name, "base": {**EXAMPLE, "name": name},
                                     "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}})
    return local_service.app.state.sweeps.create_sweep(spec, driver="external", token="driver", project=project)


def trial(local_service, sweep, trial_id: str = "t1", *, status: RunStatus = RunStatus.RUNNING):
    """Register a trial as the sweep's driver does (its run STARTING), then move it to ``status``."""
    spec = RunSpec.model_validate({**EXAMPLE, "name": f"{sweep.name}-{trial_id}"})
    run = local_service.app.state.sweeps.register_trial(sweep.id, trial_id=trial_id, spec=spec,
                                                         params={"optimizer.lr": 0.05}, token=f"token-{trial_id}")
    local_service.repo.transition(run.id, RunStatus.RUNNING)
    if status is not RunStatus.RUNNING:
        local_service.repo.transition(run.id, status)
    return local_service.repo.get_run(run.id)


def new_project(local_service) -> str:
    name = f"p-{time.monotonic_ns() % 10**9}"
    local_service.app.state.access.create_project(name)
    return name


def gone(get, record_id: str) -> bool:
    try:
        get(record_id)
    except Exception as exc:  # RunNotFound, SweepNotFound
        return "NotFound" in type(exc).__name__
    return False


# --- archive, unarchive, delete -----------------------------------------------------------------

def test_a_run_is_archived_unarchived_then_deleted_after_confirming_and_the_list_comes_back(page, local_service):
    repo = local_service.repo
    run = make_run(repo, "housekeeping-run")
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    archive, unarchive, delete = page.locator("#archive-run"), page.locator("#unarchive-run"), page.locator("#delete-run")
    expect(archive).to_be_visible()
    expect(unarchive).to_be_hidden()
    expect(delete).to_be_hidden()  # a RUNNING run cannot be deleted
    expect(page.locator('[data-fact="archived"]')).to_have_count(0)

    archive.click()
    fact = page.locator('[data-fact="archived"]')
    expect(fact).to_contain_text("hidden from the runs list")
    expect(fact.locator("a")).to_have_attribute("href", "#/runs?archived=true")
    archived_at = repo.get_run(run.id).archived_at
    assert archived_at is not None
    expect(fact.locator("time")).to_have_attribute("datetime", re.compile(archived_at.strftime("%Y-%m-%dT%H:%M:%S")))
    expect(unarchive).to_be_focused()  # the keyboard stays on the buttons
    expect(archive).to_be_hidden()
    save_screenshot(page, "run-archived-1280", full_page=False)

    unarchive.click()
    expect(page.locator('[data-fact="archived"]')).to_have_count(0)
    expect(archive).to_be_visible()
    assert repo.get_run(run.id).archived_at is None

    repo.transition(run.id, RunStatus.COMPLETED)
    expect(delete).to_be_visible()
    delete.click()
    dialog = page.locator("#delete-run-dialog")
    expect(dialog).to_contain_text("Delete this run?")
    expect(dialog).to_contain_text("“housekeeping-run” is COMPLETED")
    expect(dialog).to_contain_text("This cannot be undone.")
    page.get_by_role("button", name="Keep it").click()
    expect(dialog).to_be_hidden()
    assert not gone(repo.get_run, run.id)

    delete.click()
    page.keyboard.press("Tab")  # focus starts on "Keep it"; the next button deletes
    expect(page.locator("#confirm-delete-run")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"#/runs$"))
    expect(page.locator("#runs-count")).to_contain_text("run")  # the list has loaded
    expect(page.locator(f'tr[data-run-id="{run.id}"]')).to_have_count(0)
    assert gone(repo.get_run, run.id)


def test_a_refused_delete_says_why_and_escape_never_repeats_a_confirm(page, local_service):
    sweep = external_sweep(local_service, "live-sweep")
    failed = trial(local_service, sweep, status=RunStatus.FAILED)  # ended, but its sweep still runs
    deletes: list[str] = []
    page.on("request", lambda r: deletes.append(r.url) if r.method == "DELETE" else None)
    page.goto(dashboard_url(local_service.url, f"runs/{failed.id}"))
    delete = page.locator("#delete-run")
    delete.click()
    page.locator("#confirm-delete-run").click()
    problem = page.locator("#run-action-error")
    expect(problem).to_contain_text(f"Could not delete: run {failed.id} is a trial of sweep {sweep.id}, which is RUNNING")
    expect(page).to_have_url(re.compile(rf"#/runs/{failed.id}$"))  # still here

    delete.click()  # open again, then Escape: nothing is deleted
    dialog = page.locator("#delete-run-dialog")
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    assert dialog.evaluate("d => d.returnValue") != "confirm"
    assert len(deletes) == 1 and not gone(local_service.repo.get_run, failed.id)


def test_a_sweep_is_archived_then_deleted_with_its_trials(page, local_service):
    sweeps = local_service.app.state.sweeps
    sweep = external_sweep(local_service, "sweep-to-delete")
    done = trial(local_service, sweep, status=RunStatus.COMPLETED)
    page.goto(dashboard_url(local_service.url, f"sweeps/{sweep.id}"))
    expect(page.locator("#trials-table tbody tr")).to_have_count(1)
    expect(page.locator("#delete-sweep")).to_be_hidden()  # RUNNING

    page.locator("#archive-sweep").click()
    expect(page.locator('.sweep-facts [data-fact="archived"]')).to_contain_text("hidden from the sweeps list")
    assert sweeps.sweep_view(sweep.id).archived_at is not None
    page.locator("#unarchive-sweep").click()
    expect(page.locator('.sweep-facts [data-fact="archived"]')).to_have_count(0)
    assert sweeps.sweep_view(sweep.id).archived_at is None

    sweeps.cancel(sweep.id)  # an external sweep is CANCELED at once
    delete = page.locator("#delete-sweep")
    expect(delete).to_be_visible()
    delete.click()
    dialog = page.locator("#delete-sweep-dialog")
    expect(dialog).to_contain_text("“sweep-to-delete” (1 trial) is CANCELED")
    save_screenshot(page, "sweep-delete-dialog-1280", full_page=False)
    page.locator("#confirm-delete-sweep").click()
    expect(page).to_have_url(re.compile(r"#/sweeps$"))
    expect(page.locator("#sweeps-count")).to_be_visible()
    expect(page.locator(f'tr[data-sweep-id="{sweep.id}"]')).to_have_count(0)
    assert gone(sweeps.get_sweep, sweep.id) and gone(local_service.repo.get_run, done.id)


# --- who sees which buttons ---------------------------------------------------------------------

def test_buttons_follow_the_keys_role_in_the_records_own_project_not_its_highest(browser, local_service):
    from service.access import Role

    repo = local_service.repo
    elsewhere = new_project(local_service)
    key = local_service.app.state.access.create_key(
        name="viewer here, member elsewhere", roles={"default": Role.VIEWER, elsewhere: Role.MEMBER})[1]
    runs = {project: make_run(repo, f"roles-{project}", project=project) for project in ("default", elsewhere)}
    for run in runs.values():
        repo.add_checkpoint(run.id, CheckpointReport(step=10, epoch=1, time=datetime.now(timezone.utc), bytes=100,
                                                     committed=True, url=f"file:///tmp/{run.id}/ba10", world_size=1))
    sweeps = {project: external_sweep(local_service, f"roles-sweep-{project}", project) for project in
              ("default", elsewhere)}
    with page_with_key(browser, key) as page:
        page.goto(dashboard_url(local_service.url, f"runs/{runs['default'].id}"))
        # "All projects": the switcher's role is the key's highest, member...
        page.wait_for_function("document.body.dataset.role === 'member'")
        expect(page.locator("main")).to_have_attribute("data-project-role", "viewer")
        expect(page.locator('[data-action="export-model"]')).to_have_count(1)  # the checkpoints have loaded
        for selector in MEMBER_ACTIONS:  # ...but this run is in a project where the key only views
            expect(page.locator(selector)).to_be_hidden()

        page.goto(dashboard_url(local_service.url, f"runs/{runs[elsewhere].id}"))
        expect(page.locator("main")).to_have_attribute("data-project-role", "member")
        expect(page.locator('[data-action="export-model"]')).to_have_count(1)
        for selector in MEMBER_ACTIONS:
            expect(page.locator(selector)).to_be_visible()

        page.goto(dashboard_url(local_service.url, f"sweeps/{sweeps['default'].id}"))
        expect(page.locator(".page-head .badge")).to_have_text("▶ RUNNING")
        expect(page.locator("#cancel-sweep")).to_be_hidden()
        expect(page.locator("#archive-sweep")).to_be_hidden()
        page.goto(dashboard_url(local_service.url, f"sweeps/{sweeps[elsewhere].id}"))
        expect(page.locator("#cancel-sweep")).to_be_visible()
        expect(page.locator("#archive-sweep")).to_be_visible()

        # With the viewer's project chosen in the switcher, a run of the other project still
        # offers what the key may do there.
        page.select_option("#project", "default")
        page.wait_for_function("document.body.dataset.role === 'viewer'")
        page.goto(dashboard_url(local_service.url, f"runs/{runs[elsewhere].id}"))
        expect(page.locator("#archive-run")).to_be_visible()
        expect(page.locator("#cancel-run")).to_be_visible()
        page.goto(dashboard_url(local_service.url, "runs"))  # a list page: the switcher's role again
        expect(page.locator("main")).not_to_have_attribute("data-project-role", re.compile(".*"))


def test_a_viewer_is_offered_no_cancel_on_a_sweep(browser, local_service):
    from service.access import Role

    viewer = local_service.app.state.access.create_key(name="sweep viewer", roles={"default": Role.VIEWER})[1]
    sweep = external_sweep(local_service, "viewed-sweep")
    with page_with_key(browser, viewer) as page:
        page.goto(dashboard_url(local_service.url, f"sweeps/{sweep.id}"))
        expect(page.locator(".page-head .badge")).to_have_text("▶ RUNNING")
        page.wait_for_function("document.body.dataset.role === 'viewer'")
        for selector in ["#cancel-sweep", "#archive-sweep", "#unarchive-sweep", "#delete-sweep"]:
            expect(page.locator(selector)).to_be_hidden()
        expect(page.locator("#sweep-runs-link")).to_be_visible()


def test_a_trial_its_sweep_drives_links_to_the_sweep_instead_of_a_cancel_that_would_be_refused(page, local_service):
    repo = local_service.repo
    sweep = external_sweep(local_service, "driving-sweep")
    run = trial(local_service, sweep)
    page.goto(dashboard_url(local_service.url, f"runs/{run.id}"))
    expect(page.locator(".page-head .badge")).to_have_text("▶ RUNNING")
    via_sweep = page.locator("#cancel-via-sweep")
    expect(via_sweep).to_be_visible()
    expect(via_sweep.locator("a")).to_have_attribute("href", f"#/sweeps/{sweep.id}")
    expect(page.locator("#cancel-run")).to_be_hidden()
    assert_fits_width(page, NARROW)
    save_screenshot(page, "run-trial-driven-800", full_page=False)
    page.set_viewport_size({"width": WIDE, "height": 900})

    # Ended, then resumed by hand: an ordinary run of its own, which its own Cancel stops.
    local_service.app.state.sweeps.end_trial(sweep.id, "t1", outcome="failed", error="RuntimeError: boom")
    repo.resume_run(run.id)
    expect(page.locator(".page-head .badge")).to_have_text("◷ QUEUED")
    cancel = page.locator("#cancel-run")
    expect(cancel).to_be_visible()
    expect(via_sweep).to_be_hidden()
    repo.begin_attempt(run.id, token="own-job")  # the dispatcher starts it as a job of its own
    repo.transition(run.id, RunStatus.RUNNING)
    expect(page.locator(".page-head .badge")).to_have_text("▶ RUNNING")
    expect(page.locator('#events li[data-to="RUNNING"]')).to_have_count(2)
    expect(cancel).to_be_visible()
    expect(via_sweep).to_be_hidden()
    cancel.click()
    page.locator("#confirm-cancel").click()
    expect(page.locator(".page-head .badge")).to_have_text("■ CANCELING")
    assert repo.get_run(run.id).status is RunStatus.CANCELING

