"""``GET /runs/{id}/model``: streams the export the workers wrote; 404s name what is missing."""

from __future__ import annotations

import pytest

from service.storage_paths import export_url
from service.settings import Settings


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                    worker_python="/opt/venv/bin/python", storage_url=f"file://{tmp_path}/storage")


def test_the_newest_or_chosen_export_is_streamed(client, example_body, settings):
    run_id = client.post("/api/v1/runs", json=example_body).json()["id"]
    missing = client.get(f"/api/v1/runs/{run_id}/model")
    assert missing.status_code == 404 and "no exported model yet" in missing.json()["detail"]
    for step, data in ((5, b"five"), (9, b"nine" * 300_000)):
        path = export_url(settings.storage_url, run_id, step, "safetensors").removeprefix("file://")
        import os

        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").write(data)
    newest = client.get(f"/api/v1/runs/{run_id}/model")
    assert newest.status_code == 200 and newest.content == b"nine" * 300_000
    assert newest.headers["x-tessera-step"] == "9" and f"{run_id}-step-9.safetensors" in newest.headers["content-disposition"]
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"step": 5}).content == b"five"
    other = client.get(f"/api/v1/runs/{run_id}/model", params={"step": 6})
    assert other.status_code == 404 and "exported steps: [5, 9]" in other.json()["detail"]
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"format": "torch"}).status_code == 404
    assert client.get(f"/api/v1/runs/{run_id}/model", params={"format": "onnx"}).status_code == 422
    assert client.get("/api/v1/runs/nope/model").status_code == 404
