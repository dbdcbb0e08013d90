"""The run page's lineage in a real browser: the Fork… dialog edits the spec as YAML, shows the
API's 422 inside the dialog, and opens the child, which links to its parent; the parent lists
its fork; Continue… on a COMPLETED run shows a refusal, then queues the next attempt."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import yaml
from playwright.sync_api import expect

from api.views import CheckpointReport, RunStatus
from tests.dashboard.conftest import WIDE, dashboard_url
from tests.dashboard.test_dashboard_pages import make_run


def _completed_run_with_a_checkpoint(repo):
    run = make_run(repo, "fork-me")
    repo.add_checkpoint(run.id, CheckpointReport(step=40, epoch=2, time=datetime.now(timezone.utc), bytes=1000,
                                                 committed=True, url=f"file:///tmp/runs/{run.id}/checkpoints/ep2-ba40",
                                                 world_size=1))
    repo.transition(run.id, RunStatus.COMPLETED)
    return repo.get_run(run.id)


def test_fork_dialog_shows_the_api_s_refusal_then_opens_the_child_and_continue_queues_attempt_two(
        page, local_service):
    parent = _completed_run_with_a_checkpoint(local_service.repo)
    page.goto(dashboard_url(local_service.url, f"runs/{parent.id}"))
    expect(page.locator("#checkpoints tbody tr")).to_have_count(1)  # the dialog offers the checkpoints listed
    page.click("#fork-run")
    spec = yaml.safe_load(page.input_value("#fork-spec"))
    assert spec == parent.spec
    page.fill("#fork-spec", yaml.safe_dump({**spec, "model": {"name": "resnet18"}}))
    page.click("#confirm-fork")
    expect(page.locator("#fork-error")).to_contain_text("model: the model changed")
    expect(page.locator("#fork-dialog")).to_be_visible()  # still open, to fix the spec

    page.fill("#fork-spec", yaml.safe_dump({**spec, "optimizer": {**spec["optimizer"], "lr": 0.05}}))
    page.select_option("#fork-from", "40")
    page.click("#confirm-fork")
    expect(page).not_to_have_url(re.compile(re.escape(parent.id) + "$"))
    expect(page.locator("#parent-link")).to_have_text(f"run {parent.id}")
    [child] = local_service.repo.list_runs(projects=None)[0][:1]
    assert child.parent_id == parent.id and child.fork["patch"] == {"optimizer": {"lr": 0.05}}
    assert child.fork["step"] == 40

    page.click("#parent-link")
    expect(page.locator("#run-children a")).to_have_attribute("href", f"#/runs/{child.id}")
    page.click("#continue-run")
    page.fill("#continue-duration", "1ba")
    page.click("#confirm-continue")
    expect(page.locator("#continue-error")).to_contain_text("max_duration")
    page.fill("#continue-duration", "9ep")
    page.click("#confirm-continue")
    expect(page.locator("#continue-dialog")).to_be_hidden()
    expect(page.locator(".page-head [data-status]")).to_have_attribute("data-status", "QUEUED")
    expect(page.locator("#continue-run")).to_be_hidden()


def test_a_viewer_sees_the_lineage_but_neither_fork_nor_continue(browser, local_service):
    from service.access import Role

    parent = _completed_run_with_a_checkpoint(local_service.repo)
    viewer = local_service.app.state.access.create_key(name="lineage viewer", roles={"default": Role.VIEWER})[1]
    context = browser.new_context(viewport={"width": WIDE, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('tessera.apiKey', {viewer!r})")
    page = context.new_page()
    try:
        page.goto(dashboard_url(local_service.url, f"runs/{parent.id}"))
        page.wait_for_function("document.body.dataset.role === 'viewer'")
        expect(page.locator("#children")).to_contain_text("No forks yet.")
        expect(page.locator("#fork-run")).to_be_hidden()
        expect(page.locator("#continue-run")).to_be_hidden()
    finally:
        context.close()
