"""The service's console and a run's log carry no line per HTTP request (``api.process_logging``)."""

from __future__ import annotations

import logging

import httpx
import pytest

from api.process_logging import CHATTY_LOGGERS, quiet_http_clients


@pytest.fixture
def http_levels():
    """Put the HTTP client's loggers back as they were: other tests read them."""
    levels = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def _send_one() -> None:
    with httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200))) as client:
        client.post("http://tessera.test/api/v1/runs/r1/report/metrics", json={})


def test_a_request_logs_no_line_once_the_http_client_is_quiet_and_a_warning_still_shows(http_levels, caplog):
    caplog.set_level(logging.INFO)
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)  # as a fresh process has them
    _send_one()
    assert any("HTTP Request: POST" in r.getMessage() for r in caplog.records)  # httpx's line a request
    caplog.clear()
    quiet_http_clients()
    _send_one()
    assert not [r for r in caplog.records if r.name.startswith(CHATTY_LOGGERS)]
    logging.getLogger("httpx").warning("a failure still shows")
    assert [r.getMessage() for r in caplog.records] == ["a failure still shows"]


def test_the_service_quiets_the_http_client_its_dispatcher_calls_ray_with(http_levels, tmp_path):
    from service.app import create_app
    from service.settings import Settings

    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    create_app(Settings(home=tmp_path / "home"), jobs=object(), run_dispatcher=False)  # its lifespan is not run
    assert all(logging.getLogger(name).level == logging.WARNING for name in CHATTY_LOGGERS)


def test_a_process_that_logs_at_debug_keeps_every_request(http_levels):
    root = logging.getLogger()
    level = root.level
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        root.setLevel(logging.DEBUG)  # tessera serve --log-level debug
        quiet_http_clients()
        assert all(logging.getLogger(name).level == logging.NOTSET for name in CHATTY_LOGGERS)
    finally:
        root.setLevel(level)
