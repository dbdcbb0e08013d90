"""The dashboard asks for an API key once when the API answers 401, keeps it for the tab, and
hides what a viewer may not do."""

from __future__ import annotations

from tests.conftest import TEST_ADMIN_KEY
from tests.dashboard.conftest import WIDE, dashboard_url


def test_the_key_prompt_appears_on_401_and_the_entered_key_is_used(browser, local_service):
    viewer = local_service.app.state.access.create_key(name="viewer", roles={"default": _viewer()})[1]
    context = browser.new_context(viewport={"width": WIDE, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    console: list[str] = []  # chromium warns here when a form is removed before its submission ends
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    try:
        page.goto(dashboard_url(local_service.url, "runs"))
        dialog = page.locator("#key-dialog")
        dialog.wait_for(state="visible")
        assert "credentials" in dialog.inner_text()
        assert not page.locator("#key-error").is_visible()  # no empty error box before any key was tried
        page.fill("#key-input", viewer)
        page.click("#key-submit")
        page.locator("#key-dialog").wait_for(state="detached")
        page.wait_for_function("document.body.dataset.role === 'viewer'")
        assert page.evaluate("sessionStorage.getItem('tessera.apiKey')") == viewer
        assert not page.locator("[data-nav=submit]").is_visible()  # a viewer cannot submit
        assert page.locator("#project option").all_inner_texts() == ["All projects", "default"]
        page.reload()  # the tab keeps its key: no second prompt
        page.wait_for_function("document.body.dataset.role === 'viewer'")
        assert page.locator("#key-dialog").count() == 0
        # a wrong key is refused and asked for again
        page.evaluate("sessionStorage.setItem('tessera.apiKey', 'tsk_wrong')")
        page.reload()
        page.locator("#key-dialog").wait_for(state="visible")
        assert "refused the key" in page.locator("#key-error").inner_text() and page.locator("#key-error").is_visible()
        page.fill("#key-input", TEST_ADMIN_KEY)
        page.click("#key-submit")
        page.wait_for_function("document.body.dataset.role === 'admin'")
        assert page.locator("[data-nav=submit]").is_visible()
    finally:
        context.close()
    assert errors == []
    assert not [line for line in console if "Form submission canceled" in line], console


def _viewer():
    from service.access import Role

    return Role.VIEWER
