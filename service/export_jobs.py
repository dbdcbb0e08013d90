"""Exports of a chosen step: consolidating a sharded checkpoint on a worker, on request.

Workers export the final model when training ends. Any other committed checkpoint is exported
on request (``POST /api/v1/runs/{id}/exports {"step": N}``): the service writes a request file
next to the run's exports, ``{run}/exports/requests/step-{N}.json`` (the spec, the checkpoint's
URL and the eval metrics at that step), and submits ``python -m workers.export --request URL``
as a Ray job, because consolidating needs torch and the control plane never imports it. The
export's state is read back, never stored in the database:

* ``READY``: ``step-{N}.safetensors`` exists (``GET /runs/{id}/model?step=N`` streams it);
* ``PENDING``: a request exists and its Ray job is pending or running (or Ray cannot be asked);
* ``FAILED``: the job failed, was stopped or is gone without writing the file (the error holds
  its log tail); requesting the step again submits a new job.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from typing import Any

from fsspec.core import url_to_fs

from api.views import CheckpointView, ExportView
from service.bounded_storage import bounded
from fastapi import HTTPException

from service.ray_client import RayAmbiguous, RayRefused, RayUnavailable, failure_from_logs
from service.ray_head import forwarded_env
from service.storage_paths import export_url, exports_url

REQUEST_NAME = re.compile(r"step-(\d+)\.json$")
LIVE = ("PENDING", "RUNNING")


def request_url(storage_url: str, run_id: str, step: int) -> str:
    return f"{exports_url(storage_url, run_id)}/requests/step-{step}.json"


class ExportRequests:
    """Export requests of the runs of one project (``storage_url``: the project's storage)."""

    def __init__(self, storage_url: str, jobs: Any, settings: Any):
        self.storage_url, self.jobs, self.settings = storage_url, jobs, settings

    def request(self, run_id: str, checkpoint: CheckpointView, *, spec: dict[str, Any],
                metrics: dict[str, float]) -> ExportView:
        """The export of ``checkpoint``'s step: as it is if READY or PENDING, else a new job."""
        current = self.state(run_id, checkpoint.step)
        if current is not None and current.status in ("READY", "PENDING"):
            return current
        job_id = f"export-{run_id}-step-{checkpoint.step}-{secrets.token_hex(3)}"
        url = request_url(self.storage_url, run_id, checkpoint.step)
        body = {"spec": spec, "checkpoint_url": checkpoint.url, "metrics": metrics, "job_id": job_id}
        fs, path = url_to_fs(url)
        self._storage(f"writing {url}", fs.makedirs, path.rsplit("/", 1)[0], exist_ok=True)
        self._storage(f"writing {url}", fs.pipe_file, path, json.dumps(body).encode())
        env = {**forwarded_env(), "TESSERA_STORAGE_URL": self.storage_url}
        entrypoint = f"{shlex.quote(self.settings.worker_python)} -m workers.export --request {shlex.quote(url)}"
        try:
            self.jobs.submit(job_id, entrypoint, env)
        except RayAmbiguous:
            pass  # Ray may have the job: reading the export's state asks Ray for it by its id
        except RayUnavailable as exc:
            raise HTTPException(503, f"Ray cannot be reached to export step {checkpoint.step}: {exc}; try again",
                                headers={"Retry-After": "10"}) from None
        except RayRefused as exc:
            raise HTTPException(502, f"Ray refused the export job of step {checkpoint.step}: {exc}") from None
        return ExportView(step=checkpoint.step, status="PENDING", job_id=job_id)

    def list(self, run_id: str) -> list[ExportView]:
        """Every export of the run, ready or requested, by step."""
        fs, folder = url_to_fs(exports_url(self.storage_url, run_id))
        fs.invalidate_cache(folder)
        steps = set()
        for base in (folder, f"{folder}/requests"):
            try:
                names = [p.rsplit("/", 1)[-1] for p in self._storage(f"listing {base}", fs.ls, base, detail=False)]
            except FileNotFoundError:
                continue
            steps |= {int(m.group(1)) for m in map(re.compile(r"step-(\d+)\.(?:safetensors|json)$").match, names) if m}
        return [view for step in sorted(steps) if (view := self.state(run_id, step)) is not None]

    def _storage(self, what: str, call, *args, **kwargs):
        """A storage call bounded by ``TESSERA_STORAGE_TIMEOUT_S`` (a 503 for the request)."""
        return bounded(what, self.settings.storage_timeout_s, call, *args, **kwargs)

    def state(self, run_id: str, step: int) -> ExportView | None:
        """The export at ``step``: READY, PENDING or FAILED; None if never exported nor requested."""
        fs, path = url_to_fs(export_url(self.storage_url, run_id, step, "safetensors"))
        fs.invalidate_cache(path.rsplit("/", 1)[0])
        if self._storage(f"looking for {path}", fs.exists, path):
            return ExportView(step=step, status="READY", formats=["safetensors", "torch"])
        fs, path = url_to_fs(request_url(self.storage_url, run_id, step))
        try:
            job_id = json.loads(self._storage(f"reading {path}", fs.cat_file, path))["job_id"]
        except FileNotFoundError:
            return None
        try:
            state = self.jobs.status(job_id)
        except Exception:  # Ray cannot be asked: the request stands
            return ExportView(step=step, status="PENDING", job_id=job_id)
        if state in LIVE:
            return ExportView(step=step, status="PENDING", job_id=job_id)
        why = {None: "is gone", "SUCCEEDED": "ended without writing the file"}.get(state, f"ended {state}")
        error = f"export job {job_id} {why}"
        if state in ("FAILED", "STOPPED"):
            error += ": " + failure_from_logs(self.jobs, job_id)
        return ExportView(step=step, status="FAILED", job_id=job_id, error=error[-4000:])
