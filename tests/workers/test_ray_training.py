"""Real Ray Train runs over the session's Ray head (2 workers, gloo on CPU).

Few and small on purpose: each costs ~10 s of Ray start-up and ~2.5 GB of memory.
"""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.specs import RunSpec
from workers.errors import TrainingError
from workers.ray_train import fit_with_ray

pytestmark = pytest.mark.integration
TOKEN = "run-token-abc"


class RecordingService:
    """A real HTTP server on 127.0.0.1 that accepts worker reports and records them."""

    def __init__(self):
        self.metrics, self.statuses, self.checkpoints, self.notes, self.auth = [], [], [], [], set()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.auth.add(self.headers.get("Authorization"))
                if self.path.endswith("/report/metrics"):
                    recorder.metrics += body["points"]
                    answer = {"stored": len(body["points"])}
                elif self.path.endswith("/report/checkpoint"):
                    recorder.checkpoints.append(body)
                    answer = {**body, "attempt": 1}
                elif self.path.endswith("/report/note"):
                    recorder.notes.append(body["message"])
                    answer = {"id": "r", "name": "n", "status": "RUNNING", "attempt": 1, "spec": {},
                              "created_at": "2026-01-01T00:00:00Z"}
                else:
                    recorder.statuses.append(body)
                    answer = {"id": "r", "name": "n", "status": body["status"], "attempt": 1, "spec": {},
                              "created_at": "2026-01-01T00:00:00Z"}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def steps(self, key):
        return sorted(p["step"] for p in self.metrics if p["key"] == key)


def ddp_spec(**overrides):
    body = {
        "name": "ddp",
        "model": {"name": "simple_cnn"},
        "data": {"train": {"name": "digits", "image_size": 16},
                 "eval": {"name": "digits", "split": "test", "image_size": 16}, "batch_size": 64},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "scheduler": {"name": "cosine", "warmup": "0.1dur"},
        "max_duration": "3ep",
        "eval_interval": "1ep",
        "algorithms": [{"name": "channels_last"}, {"name": "label_smoothing"}, {"name": "cutmix"}],
        "parallelism": {"strategy": "ddp", "num_workers": 2},
    }
    body.update(overrides)
    return RunSpec.model_validate(body)


def test_ddp_run_on_two_workers_with_three_algorithms_learns_and_reports_to_the_service(ray_client, tmp_path,
                                                                                     monkeypatch):
    run_id = f"test-{uuid.uuid4().hex[:8]}"
    phases_file = tmp_path / "startup-phases.json"  # rank 0 writes its start-up phases here (bench/startup.py)
    monkeypatch.setenv("TESSERA_TEST_STARTUP_FILE", str(phases_file))
    with RecordingService() as service:
        metrics = fit_with_ray(ddp_spec(), run_id=run_id, service_url=service.url, token=TOKEN,
                               storage_path=str(tmp_path))
    # Rank 0's return value: the final metrics.
    assert metrics["eval/accuracy"] > 0.5  # chance is 0.1
    # 1437 training images, batch 64 over 2 workers, drop_last: 22 steps per epoch.
    assert metrics["time/batch"] == 66 and metrics["time/epoch"] == 3 and metrics["time/progress"] == 1.0
    assert {"train/loss", "eval/loss", "lr", "throughput/samples_per_sec"} <= set(metrics)
    # What rank 0 posted over HTTP: RUNNING once, every step's loss, one evaluation per epoch.
    assert [s["status"] for s in service.statuses] == ["RUNNING"]
    assert service.auth == {f"Bearer {TOKEN}"}
    assert service.steps("train/loss") == list(range(1, 67))
    assert service.steps("eval/accuracy") == [22, 44, 66]
    final = [p["value"] for p in service.metrics if p["key"] == "eval/accuracy" and p["step"] == 66]
    assert final == [metrics["eval/accuracy"]]
    phases = json.loads(phases_file.read_text())
    assert list(phases) == ["worker_entered", "worker_imported", "trainer_built", "first_step_done", "fit_returned"]
    assert sorted(phases.values()) == list(phases.values())
    assert phases["first_step_done"] < phases["fit_returned"]  # 65 more steps and 3 evaluations came after it


def test_a_failing_worker_raises_a_training_error_naming_the_root_cause(ray_client, tmp_path):
    spec = ddp_spec(data={"train": {"name": "fashion_mnist", "root": "/nonexistent"}, "batch_size": 64},
                    algorithms=[])
    with pytest.raises(TrainingError) as info:
        fit_with_ray(spec, run_id=f"test-{uuid.uuid4().hex[:8]}", storage_path=str(tmp_path))
    assert str(info.value).startswith("FileNotFoundError: Fashion-MNIST files not found under /nonexistent")
    assert "apt-get install dataset-fashion-mnist" in str(info.value)
