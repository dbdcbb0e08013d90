"""Living with runs: edit a run's tags and notes, archive and unarchive runs and sweeps, and
delete ended ones with their storage (``service.cleanup``). Every route needs a ``member`` role
in the object's project (a viewer gets 403; another project's object is a 404)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import APIRouter, HTTPException

from api.run_edits import DeletionView, RunUpdate
from api.views import RunView, SweepView
from service.access import Role
from service.cleanup import Deletion, NotEnded, StorageUnavailable, delete_run, delete_sweep, runs_to_delete
from service.deps import CallerDep, JobsDep, RepoDep, SettingsDep, SweepsDep
from service.errors import VALIDATION_RESPONSES, ErrorBody
from service.export_jobs import stop_exports
from service.json_body import ParsedBodyRoute
from service.routes.runs import scoped_run
from service.routes.sweeps import scoped_sweep

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1", responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

NOT_FOUND = {404: {"model": ErrorBody}, 403: {"model": ErrorBody}}
DELETE_ERRORS = {**NOT_FOUND, 409: {"model": ErrorBody}, 503: {"model": ErrorBody}}


@router.patch("/runs/{run_id}", response_model=RunView, operation_id="update_run", tags=["runs"],
              responses=NOT_FOUND)
def update_run(run_id: str, update: RunUpdate, repo: RepoDep, caller: CallerDep) -> RunView:
    """Replace the run's ``tags`` and/or ``notes`` (fields left out stay; ``notes: ""`` clears).
    Any status. 422 names the bad tag and what tags may hold."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    return repo.update_run(run_id, tags=update.tags, notes=update.notes).to_view()


@router.post("/runs/{run_id}/archive", response_model=RunView, operation_id="archive_run", tags=["runs"],
             responses=NOT_FOUND)
def archive_run(run_id: str, repo: RepoDep, caller: CallerDep) -> RunView:
    """Hide the run from default lists (``GET /runs?archived=true|all`` still shows it). Any status."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    return repo.set_archived(run_id, True).to_view()


@router.post("/runs/{run_id}/unarchive", response_model=RunView, operation_id="unarchive_run", tags=["runs"],
             responses=NOT_FOUND)
def unarchive_run(run_id: str, repo: RepoDep, caller: CallerDep) -> RunView:
    """Show an archived run in default lists again."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    return repo.set_archived(run_id, False).to_view()


@router.delete("/runs/{run_id}", response_model=DeletionView, operation_id="delete_run", tags=["runs"],
               responses=DELETE_ERRORS)
def delete_run_route(run_id: str, repo: RepoDep, caller: CallerDep, settings: SettingsDep,
                     jobs: JobsDep) -> DeletionView:
    """Delete an ended run: its rows and its storage folder (checkpoints, logs, exports); an
    export of it still being made is stopped. 409 while it is live (cancel it first) or while
    its sweep is; 503 if storage refused (the run is still listed; retrying deletes what is left)."""
    scoped_run(repo, caller, run_id, Role.MEMBER)
    return _deleted(lambda: runs_to_delete(repo, run_id=run_id),
                    lambda: delete_run(repo, settings.storage_url, run_id, by=caller.key_id), jobs, settings)


@router.post("/sweeps/{sweep_id}/archive", response_model=SweepView, operation_id="archive_sweep", tags=["sweeps"],
             responses=NOT_FOUND)
def archive_sweep(sweep_id: str, sweeps: SweepsDep, caller: CallerDep) -> SweepView:
    """Hide the sweep and its trials from default lists (``GET /sweeps?archived=true|all`` and
    ``GET /runs?archived=...`` still show them)."""
    scoped_sweep(sweeps, caller, sweep_id, Role.MEMBER)
    sweeps.set_archived(sweep_id, True)
    return sweeps.sweep_view(sweep_id)


@router.post("/sweeps/{sweep_id}/unarchive", response_model=SweepView, operation_id="unarchive_sweep",
             tags=["sweeps"], responses=NOT_FOUND)
def unarchive_sweep(sweep_id: str, sweeps: SweepsDep, caller: CallerDep) -> SweepView:
    """Show an archived sweep in default lists again, with the trials archived with it."""
    scoped_sweep(sweeps, caller, sweep_id, Role.MEMBER)
    sweeps.set_archived(sweep_id, False)
    return sweeps.sweep_view(sweep_id)


@router.delete("/sweeps/{sweep_id}", response_model=DeletionView, operation_id="delete_sweep", tags=["sweeps"],
               responses=DELETE_ERRORS)
def delete_sweep_route(sweep_id: str, repo: RepoDep, sweeps: SweepsDep, caller: CallerDep,
                       settings: SettingsDep, jobs: JobsDep) -> DeletionView:
    """Delete an ended sweep, its trial runs and their storage, and the sweep's own folder; an
    export of a trial still being made is stopped. 409 while it or a trial is live."""
    scoped_sweep(sweeps, caller, sweep_id, Role.MEMBER)
    return _deleted(lambda: runs_to_delete(repo, sweep_id=sweep_id),
                    lambda: delete_sweep(repo, settings.storage_url, sweep_id, by=caller.key_id), jobs, settings)


def _deleted(runs: Callable[[], list[str]], deletion: Callable[[], Deletion], jobs, settings) -> DeletionView:
    """Make ``deletion`` of ``runs()``, with their export jobs handled before and after it."""
    try:
        run_ids = runs()  # a deletion that would be refused stops nothing
        _stop_exports(jobs, run_ids, settings)
        done = deletion()
    except NotEnded as exc:
        raise HTTPException(status_code=409, detail=exc.detail) from exc
    except StorageUnavailable as exc:
        raise HTTPException(status_code=503, detail=exc.detail) from exc
    _stop_exports(jobs, run_ids, settings)  # one a request submitted while the rows were going
    return DeletionView(kind=done.kind, id=done.id, project=done.project, run_ids=done.run_ids,
                        storage_urls=done.storage_urls)


def _stop_exports(jobs, run_ids: list[str], settings) -> None:
    """Mark the runs' export jobs as this service's (so Ray forgets them once they end, the runs
    gone) and stop those still running: they would write the model under the deleted folders.
    Best effort: with Ray unreachable the deletion goes on, and such a job may then leave its
    file behind."""
    try:
        stopped = stop_exports(jobs, run_ids, storage_root=settings.storage_url, timeout_s=settings.storage_timeout_s)
    except Exception as exc:
        log.warning("could not stop the export jobs of %d run(s) being deleted: %s", len(run_ids), exc)
        return
    if stopped:
        log.info("stopped the export jobs %s of run(s) being deleted", stopped)
