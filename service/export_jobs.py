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

Ray lists every job it was not told to forget, and the dispatcher reads that list every tick, so
finished export jobs must not stay there (``service.log_archive``). Before a job is submitted,
the service marks it as its own in storage (``export_job_url``: ``{root}/export-jobs/{job
id}.json``), so the log archiver can tell it from another service's on a shared cluster, also
once its run has been deleted. Once an export job has finished, the archiver has its outcome
stored (``ExportOutcomes``): nothing when the file is there or the run is gone, else
``requests/outcomes/{job id}.json`` with the error as above; then Ray forgets the job, then the
mark goes. A mark whose job Ray listed at neither of two looks at least ``stray_marks_after_s``
apart (the log archiver's) goes too: its job never reached Ray (the service stopped between the
mark and the submit, or Ray never got a submit whose answer was lost), Ray forgot it and the
mark's removal failed, or someone deleted it from Ray. A FAILED export reads its error from that
file. An outcome stays until its run is deleted, also once a new request replaced its job.
Deleting a run stops its export jobs still running (``stop_exports``, before and after the rows
go): they would write the model under the deleted folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fsspec.core import url_to_fs

from api.views import CheckpointView, ExportView
from service.bounded_storage import StorageTimeout, bounded
from service.code_store import write_whole
from fastapi import HTTPException

from service.ray_client import (RayAmbiguous, RayRefused, RayUnavailable, failure_from_logs, failure_text,
                                job_states)
from service.ray_head import forwarded_env
from service.storage_paths import export_job_url, export_jobs_url, export_url, exports_url, project_storage_url

log = logging.getLogger(__name__)

LIVE = ("PENDING", "RUNNING")
JOB_ID = re.compile(r"export-(?P<run_id>.+)-step-(?P<step>\d+)-[0-9a-f]{6}$")  # as ``request`` names them


def request_url(storage_url: str, run_id: str, step: int) -> str:
    return f"{exports_url(storage_url, run_id)}/requests/step-{step}.json"


def outcome_url(storage_url: str, run_id: str, job_id: str) -> str:
    """Where a finished export job's outcome is kept once Ray may forget the job."""
    return f"{exports_url(storage_url, run_id)}/requests/outcomes/{job_id}.json"


def parse_export_job_id(job_id: str) -> tuple[str, int] | None:
    """``(run id, step)`` of an export job's id; None for any other job."""
    match = JOB_ID.match(job_id)
    return (match["run_id"], int(match["step"])) if match else None


def job_error(job_id: str, state: str | None, failure: str = "") -> str:
    """Why the export job ``job_id``, in ``state`` (None: Ray has no such job), wrote no file;
    ``failure``: what ``failure_from_logs`` says of a FAILED or STOPPED job."""
    why = {None: "is gone", "SUCCEEDED": "ended without writing the file"}.get(state, f"ended {state}")
    return (f"export job {job_id} {why}" + (f": {failure}" if failure else ""))[-4000:]


def read_outcome(fs: Any, path: str, timeout_s: float) -> str | None:
    """The error stored at ``path`` by ``ExportOutcomes``; None if there is none, or none readable."""
    try:
        return json.loads(bounded(f"reading {path}", timeout_s, fs.cat_file, path))["error"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # not a whole outcome (written outside write_whole)
        return None


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
        # The mark first: a request file never names a job that is not marked
        self._storage("marking the export job", mark_export_job, self.settings.storage_url, job_id)
        fs, path = url_to_fs(url)
        try:
            self._storage(f"writing {url}", write_whole, fs, path, json.dumps(body).encode())
        except BaseException:
            self._unmark(job_id)
            raise
        env = {**forwarded_env(), "TESSERA_STORAGE_URL": self.storage_url}
        entrypoint = f"{shlex.quote(self.settings.worker_python)} -m workers.export --request {shlex.quote(url)}"
        try:
            self.jobs.submit(job_id, entrypoint, env)
        except RayAmbiguous:
            pass  # Ray may have the job: reading the export's state asks Ray for it by its id
        except RayUnavailable as exc:
            self._unmark(job_id)
            raise HTTPException(503, f"Ray cannot be reached to export step {checkpoint.step}: {exc}; try again",
                                headers={"Retry-After": "10"}) from None
        except RayRefused as exc:
            self._unmark(job_id)
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

    def _unmark(self, job_id: str) -> None:
        """The job was not submitted: its mark goes (best effort; a mark without a job is only a file)."""
        try:
            bounded(f"unmarking {job_id}", self.settings.storage_timeout_s, unmark_export_job,
                    self.settings.storage_url, job_id)
        except Exception as exc:
            log.warning("could not remove the mark of the export job %s: %s", job_id, exc)

    def _storage(self, what: str, call, *args, **kwargs):
        """A storage call bounded by ``TESSERA_STORAGE_TIMEOUT_S``; a timeout or another storage
        error is a 503 for the request (a missing file is the caller's to handle)."""
        try:
            return bounded(what, self.settings.storage_timeout_s, call, *args, **kwargs)
        except (StorageTimeout, FileNotFoundError):
            raise
        except OSError as exc:
            raise HTTPException(503, f"storage refused {what}: {exc}; try again",
                                headers={"Retry-After": "10"}) from None

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
        # Ended: its stored outcome once the log archiver has made it (the only word left once Ray
        # has forgotten the job; and a job Ray wrote again as "supervisor died" does not replace it).
        fs, path = url_to_fs(outcome_url(self.storage_url, run_id, job_id))
        error = read_outcome(fs, path, self.settings.storage_timeout_s)
        if error is None:
            failure = failure_from_logs(self.jobs, job_id) if state in ("FAILED", "STOPPED") else ""
            error = job_error(job_id, state, failure)
        return ExportView(step=step, status="FAILED", job_id=job_id, error=error)


def mark_export_job(storage_root: str, job_id: str) -> None:
    """Mark the export job ``job_id`` as this service's (``export_job_url``)."""
    run_id, step = parse_export_job_id(job_id)
    fs, path = url_to_fs(export_job_url(storage_root, job_id))
    write_whole(fs, path, json.dumps({"run_id": run_id, "step": step}).encode())


def unmark_export_job(storage_root: str, job_id: str) -> None:
    """Remove the mark of the export job ``job_id``; one that is not there is fine (a job
    submitted before marks existed)."""
    fs, path = url_to_fs(export_job_url(storage_root, job_id))
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path)


def stop_exports(jobs: Any, run_ids: Iterable[str], *, storage_root: str, timeout_s: float) -> list[str]:
    """Before runs are deleted: mark every export job of ``run_ids`` that Ray lists as this
    service's (a job submitted before marks existed has none, and once its run is gone only a
    mark tells it from another service's), and ask Ray to stop those pending or running (they
    would write the model under the deleted folders). Returns the ids stopped. Each job is
    handled on its own: a failing call is logged and the others go on. Raises only when Ray's
    job list cannot be read; a Jobs client that cannot list jobs stops nothing."""
    runs = set(run_ids)
    states = job_states(jobs) or {}
    stopped = []
    for job_id, state in sorted(states.items()):
        parsed = parse_export_job_id(job_id)
        if parsed is None or parsed[0] not in runs:
            continue
        try:
            bounded(f"marking {job_id}", timeout_s, mark_export_job, storage_root, job_id)
        except Exception as exc:
            log.warning("could not mark the export job %s of a run being deleted: %s", job_id, exc)
        if state in LIVE:
            try:
                jobs.stop(job_id)
                stopped.append(job_id)
            except Exception as exc:
                log.warning("could not stop the export job %s of a run being deleted: %s", job_id, exc)
    return stopped


class ExportOutcomes:
    """Stores what finished export jobs leave behind, so that Ray can forget them, and keeps their
    marks: the log archiver calls ``owners_of`` and ``settle`` from its passes, ``unmark`` once
    Ray has forgotten a job, and ``marked`` and ``unmark`` for marks whose job Ray never had.
    ``owners``: ``(project, ...)`` of each run id that names a run (``AttemptStore.job_owners``);
    ``storage_root``: the service's storage, under which each project has its own
    (``project_storage_url``)."""

    def __init__(self, storage_root: str, jobs: Any, owners: Callable[[Iterable[str]], Mapping[str, tuple]],
                 *, timeout_s: float):
        self.storage_root, self.jobs, self.owners, self.timeout_s = storage_root, jobs, owners, timeout_s

    def owners_of(self, job_ids: Iterable[str]) -> dict[str, str]:
        """``{run id: project}`` of the runs of ``job_ids`` (export jobs) this database holds."""
        runs = [parsed[0] for job_id in job_ids if (parsed := parse_export_job_id(job_id)) is not None]
        return {run_id: owner[0] for run_id, owner in self.owners(runs).items()}

    def settle(self, job_id: str, state: str, projects: Mapping[str, str]) -> bool:
        """Store the outcome of the finished export job ``job_id`` (Ray's ``state``), unless its
        file is there, its outcome is stored already or its run is gone. True: the job is this
        service's (marked when submitted, or its run is in ``projects``, ``owners_of``: a job
        submitted before marks existed) and Ray may forget it now; False: another service's on
        a shared cluster, left in Ray's list. A storage or Ray error is raised (a Ray timeout
        while reading its log too: stored, that error would be all that is left)."""
        run_id, step = parse_export_job_id(job_id)
        if run_id not in projects:  # deleted since, or not this service's
            return self._exists(export_job_url(self.storage_root, job_id))
        storage_url = project_storage_url(self.storage_root, projects[run_id])
        outcome = outcome_url(storage_url, run_id, job_id)
        if self._exists(export_url(storage_url, run_id, step, "safetensors")):
            return True  # READY: nothing to keep
        if self._exists(outcome):
            return True  # stored by an earlier pass (Ray wrote the job again, or another leader)
        failure = ""
        if state in ("FAILED", "STOPPED"):
            failure = failure_text(job_id, self.jobs.logs_tail(job_id))
        body = json.dumps({"job_id": job_id, "state": state, "error": job_error(job_id, state, failure)}).encode()
        fs, path = url_to_fs(outcome)
        bounded(f"writing {path}", self.timeout_s, write_whole, fs, path, body)
        return True

    def marked(self) -> set[str]:
        """The ids of the export jobs marked as this service's now (one listing; a storage error
        is raised)."""
        fs, folder = url_to_fs(export_jobs_url(self.storage_root))
        fs.invalidate_cache(folder)
        try:
            paths = bounded(f"listing {folder}", self.timeout_s, fs.ls, folder, detail=False)
        except FileNotFoundError:
            return set()
        stems = (path.rsplit("/", 1)[-1].removesuffix(".json") for path in paths)
        return {stem for stem in stems if parse_export_job_id(stem) is not None}  # not a partial write

    def unmark(self, job_id: str) -> None:
        """The export job's mark goes: Ray has forgotten the job, or never had it (a storage
        error is raised)."""
        bounded(f"unmarking {job_id}", self.timeout_s, unmark_export_job, self.storage_root, job_id)

    def _exists(self, url: str) -> bool:
        """Whether ``url`` is there now (not as fsspec's listing cache last saw it)."""
        fs, path = url_to_fs(url)
        fs.invalidate_cache(path.rsplit("/", 1)[0])
        return bool(bounded(f"looking for {path}", self.timeout_s, fs.exists, path))
