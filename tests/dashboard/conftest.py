"""Fixtures for the dashboard's tests: Debian's chromium driven by Playwright, a live service
against a real Ray head and PostgreSQL, an in-process service over SQLite with a do-nothing
Ray client (for pages that need no training), and screenshots saved as test artifacts.

Chromium comes from Debian (`make browser`); Playwright's own browser download cannot work
on these machines. Without chromium the browser tests fail and say how to install it.
"""

from __future__ import annotations

import contextlib

import os
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TEST_ADMIN_KEY, free_port

SCREENSHOTS = REPO_ROOT / "artifacts" / "screenshots"
DOC_SCREENSHOTS = REPO_ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("TESSERA_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags headless chromium's outbound connections (to the
# service on loopback, too) are refused many at a time; --no-sandbox because tests run as root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WIDE, NARROW = 1280, 800
POLL_MS = 500  # the dashboard polls every 3 s; tests ask for faster polls with ?poll_ms=


@pytest.fixture(scope="module")
def browser():  # per module: Playwright's sync API keeps an event loop while it runs
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"Debian's chromium is not installed at {CHROMIUM}: run `make browser` as root "
                    "(apt-get install chromium), or point TESSERA_CHROMIUM at a Chromium binary. "
                    "The dashboard's browser tests cannot run without it.", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: `make venv` installs it from requirements.txt", pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh browser page at 1280x900 that fails the test on any uncaught script error; its
    tab uses the suite's admin key."""
    with page_with_key(browser, TEST_ADMIN_KEY) as fresh:
        yield fresh


@contextlib.contextmanager
def page_with_key(browser, key: str):
    """A fresh browser page at 1280x900 whose tab uses API key ``key`` (the dashboard keeps it in
    sessionStorage), failing the test on any uncaught script error."""
    context = browser.new_context(viewport={"width": WIDE, "height": 900})
    context.add_init_script(f"sessionStorage.setItem('tessera.apiKey', {key!r})")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(30_000)
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"uncaught errors in the page: {errors}"


def dashboard_url(base_url: str, route: str) -> str:
    return f"{base_url}/?poll_ms={POLL_MS}#/{route}"


def save_screenshot(page, name: str, *, full_page: bool = True) -> Path:
    """Save a PNG under artifacts/screenshots/ (gitignored); with TESSERA_UPDATE_DOC_SCREENSHOTS=1
    also refresh docs/screenshots/<name>.png (viewport only, reduced to 256 colours)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    if os.environ.get("TESSERA_UPDATE_DOC_SCREENSHOTS") == "1" and name in DOC_SCREENSHOT_NAMES:
        from PIL import Image

        DOC_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        viewport = SCREENSHOTS / f"{name}.viewport.png"
        page.screenshot(path=str(viewport), full_page=False)
        Image.open(viewport).convert("RGB").quantize(colors=256).save(DOC_SCREENSHOTS / f"{name}.png", optimize=True)
    return path


DOC_SCREENSHOT_NAMES = {"runs-1280", "run-1280", "submit-error-800", "sweep-1280", "sweep-800", "run-logs-1280",
                        "compare-1280"}


def assert_fits_width(page, width: int, settle_ms: int = 5000) -> None:
    """Nothing on the page is wider than the window (no horizontal scrolling), once its layout
    has settled: the charts take their new width from a ResizeObserver, which fires after the
    frame in which the window changed (seen in CI: 812 px at an 800 px window for that frame)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_function(f"document.documentElement.clientWidth === {width}")
    with contextlib.suppress(PlaywrightTimeout):  # the assertion below says how wide it stayed
        page.wait_for_function(f"document.documentElement.scrollWidth <= {width}", timeout=settle_ms)
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= width, f"page is {scroll_width}px wide at a {width}px window after {settle_ms} ms"


# --- a live service: real Ray head, PostgreSQL, `tessera serve` in a subprocess ---------

@pytest.fixture(scope="module")
def live_service(tmp_path_factory, ray_head, postgres_url):
    from tests.e2e.conftest import cluster_service

    with cluster_service(tmp_path_factory.mktemp("tessera-dashboard"), ray_address=ray_head.dashboard_url,
                         postgres_url=postgres_url) as service:
        yield service


# --- an in-process service over SQLite with a do-nothing Ray client ---------------------

class IdleJobs:
    """A Ray Jobs client whose jobs never run: runs stay where the test puts them. Every job reads
    RUNNING until a test ends it (``ended``), as a run's job ends after its run does."""

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        pass

    ended: dict[str, str] = {}  # job id -> SUCCEEDED, FAILED or STOPPED (shared: job ids are unique per run)

    def status(self, submission_id: str) -> str | None:
        return self.ended.get(submission_id, "RUNNING")

    def stop(self, submission_id: str) -> None:
        pass

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        return ""

    logs: dict[str, str] = {}  # job logs a test sets (shared: job ids are unique per run)

    def job_logs(self, submission_id: str) -> str | None:
        return self.logs.get(submission_id, "")

    def delete(self, submission_id: str) -> None:
        """Nothing for Ray to forget: these jobs never finish."""


class LocalService:
    """The real app served by uvicorn on a thread; ``repo`` writes runs, events and metrics directly."""

    def __init__(self, tmp_path: Path):
        import uvicorn

        from service.app import create_app
        from service.settings import Settings

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.home = tmp_path / "home"
        settings = Settings(home=self.home, public_url=self.url, port=self.port)
        self.app = create_app(settings, jobs=IdleJobs(), run_dispatcher=False)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LocalService":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the in-process service did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def repo(self):
        return self.app.state.repo


@pytest.fixture(scope="module")
def local_service(tmp_path_factory):
    with LocalService(tmp_path_factory.mktemp("tessera-local")) as service:
        yield service
