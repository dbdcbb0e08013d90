"""A write that gives the dispatcher work wakes it: with a 60 s interval, a submitted run is
still handed to Ray at once; a read does not make it tick."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.conftest import ADMIN_HEADERS

API = "/api/v1"


def test_a_submit_wakes_the_dispatcher_and_a_read_does_not(tmp_path, fake_jobs, example_body):
    settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000", dispatch_interval_s=60,
                        storage_url=f"file://{tmp_path}/storage")
    app = create_app(settings, jobs=fake_jobs, run_dispatcher=False)
    ticked = threading.Event()
    with TestClient(app, headers=ADMIN_HEADERS) as client:
        dispatcher = app.state.dispatcher
        dispatcher.tick_listeners.append(lambda seconds: ticked.set())
        dispatcher.start()
        try:
            assert ticked.wait(30), "the loop's first tick did not run"
            ticked.clear()
            assert client.get(f"{API}/runs").status_code == 200
            assert not ticked.wait(1.0), "a read woke the dispatcher"
            run = client.post(f"{API}/runs", json=example_body).json()
            assert ticked.wait(30), "the submit did not wake the dispatcher (it would have waited 60 s)"
            assert any(run["id"] in submission for submission in fake_jobs.submit_calls)
        finally:
            dispatcher.stop()
