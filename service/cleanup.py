"""Deleting ended runs and sweeps: their rows and everything they left in storage.

A run's storage is its folder ``{project storage}/runs/{id}`` (checkpoints, attempt logs,
exports, TensorBoard files) and Ray Train's folder of each attempt,
``{project storage}/ray/attempt-{n}/tessera-{id}`` (``service.storage_paths`` mirrors
``workers.paths``); a sweep's is ``{project storage}/sweeps/{id}`` (Tune's experiment) plus
each trial's folders.

Order, so that a run is never gone with its folders left: the rows are deleted inside a
transaction that holds the row lock; the storage is removed before that transaction commits. If
storage cannot be removed the transaction rolls back and the run is still listed, with some of
its folders possibly gone already (a retry removes what is left); once the rows are gone, so is
the storage. Every deletion is logged as one structured ``audit`` record.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fsspec.core import url_to_fs
from sqlalchemy import delete, select

from api.views import RunStatus, SweepStatus
from service.db.models import Run, Sweep
from service.repository import Repository, RunNotFound
from service.storage_paths import project_storage_url, ray_attempt_url, run_url, sweep_url
from service.sweep_repository import SweepNotFound

audit = logging.getLogger("tessera.audit")


class NotEnded(Exception):
    """The run or sweep is still live (HTTP 409): cancel it first."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(detail)


class StorageUnavailable(Exception):
    """Storage refused the deletion (HTTP 503): no row was deleted (some folders may be gone)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(detail)


@dataclass
class Deletion:
    """What a deletion removed: the runs (a sweep's trials too) and the storage folders."""

    kind: str
    id: str
    project: str
    run_ids: list[str] = field(default_factory=list)
    storage_urls: list[str] = field(default_factory=list)


def run_storage_urls(storage_url: str, run_id: str, attempts: int) -> list[str]:
    """Every folder a run wrote under its project's storage: its run folder and Ray Train's
    folder of each attempt."""
    return [run_url(storage_url, run_id), *(ray_attempt_url(storage_url, run_id, n) for n in range(1, attempts + 1))]


def remove_folder(url: str) -> None:
    """Remove ``url`` and everything under it; a folder that is not there is already removed."""
    fs, path = url_to_fs(url)
    fs.invalidate_cache(path)
    try:
        if fs.exists(path):
            fs.rm(path, recursive=True)
    except FileNotFoundError:
        return  # gone meanwhile: what delete wants anyway
    except OSError as exc:
        raise StorageUnavailable(f"could not delete {url}: {exc}; the rows were kept, so it is still listed: "
                                 f"try again to delete what is left") from exc


def delete_run(repo: Repository, storage_root: str, run_id: str, *, by: str) -> Deletion:
    """Delete an ended run (409 ``NotEnded`` otherwise): its rows (events, metrics, checkpoints
    and bests go with it) and its storage folder. ``by`` names who asked, for the audit record."""
    with repo.db.locked_write(Run, run_id, RunNotFound) as (session, run):
        _refuse_live_run(session, run)
        done = Deletion("run", run_id, run.project, [run_id],
                        run_storage_urls(project_storage_url(storage_root, run.project), run_id, run.attempt))
        session.execute(delete(Run).where(Run.id == run_id))
        session.flush()
        for url in done.storage_urls:
            remove_folder(url)
    _log(done, by)
    return done


def delete_sweep(repo: Repository, storage_root: str, sweep_id: str, *, by: str) -> Deletion:
    """Delete an ended sweep (409 otherwise), its trial runs and their storage, and its own."""
    with repo.db.locked_write(Sweep, sweep_id, SweepNotFound) as (session, sweep):
        trials = _refuse_live_sweep(session, sweep)
        storage = project_storage_url(storage_root, sweep.project)
        done = Deletion("sweep", sweep_id, sweep.project, [run_id for run_id, _, _ in trials],
                        [url for run_id, _, attempts in trials for url in run_storage_urls(storage, run_id, attempts)]
                        + [sweep_url(storage, sweep_id)])
        session.execute(delete(Run).where(Run.sweep_id == sweep_id))
        session.execute(delete(Sweep).where(Sweep.id == sweep_id))
        session.flush()
        for url in done.storage_urls:
            remove_folder(url)
    _log(done, by)
    return done


def runs_to_delete(repo: Repository, *, run_id: str | None = None, sweep_id: str | None = None) -> list[str]:
    """The ids of the runs that deleting ``run_id`` (or the sweep ``sweep_id``) would delete, as
    now stored; ``NotEnded`` as that deletion would refuse it. The deletion checks again under
    its lock: this read lets a caller act before it (stop the runs' exports) only if it can go on."""
    with repo.db.read() as session:
        if run_id is not None:
            run = session.get(Run, run_id)
            if run is None:
                raise RunNotFound(run_id)
            _refuse_live_run(session, run)
            return [run_id]
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            raise SweepNotFound(sweep_id)
        return [trial_id for trial_id, _, _ in _refuse_live_sweep(session, sweep)]


def _refuse_live_run(session, run: Run) -> None:
    status = RunStatus(run.status)
    if not status.is_terminal:
        raise NotEnded(f"run {run.id} is {status.value}; only ended runs (COMPLETED, FAILED, CANCELED, "
                       f"STOPPED) can be deleted: cancel it first")
    if run.sweep_id is not None:
        live = session.execute(select(Sweep.status).where(Sweep.id == run.sweep_id)).scalar_one_or_none()
        if live is not None and not SweepStatus(live).is_terminal:
            raise NotEnded(f"run {run.id} is a trial of sweep {run.sweep_id}, which is {live}; delete it once "
                           f"the sweep has ended")


def _refuse_live_sweep(session, sweep: Sweep) -> list[tuple[str, str, int]]:
    """The sweep's trials (id, status, attempt) if it may be deleted; else ``NotEnded``."""
    status = SweepStatus(sweep.status)
    if not status.is_terminal:
        raise NotEnded(f"sweep {sweep.id} is {status.value}; only ended sweeps can be deleted: cancel it first")
    trials = [tuple(row) for row in
              session.execute(select(Run.id, Run.status, Run.attempt).where(Run.sweep_id == sweep.id)).all()]
    live = [run_id for run_id, run_status, _ in trials if not RunStatus(run_status).is_terminal]
    if live:
        raise NotEnded(f"sweep {sweep.id} still has live trials {live}; wait until they end or cancel them")
    return trials


def _log(done: Deletion, by: str) -> None:
    audit.info("deleted %s %s", done.kind, done.id,
               extra={"audit": {"action": f"{done.kind}.delete", "id": done.id, "project": done.project, "by": by,
                                "run_ids": done.run_ids, "storage_urls": done.storage_urls}})
