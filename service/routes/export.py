"""The trained model out: ``GET /api/v1/runs/{run_id}/model?format=safetensors|torch&step=``,
and ``POST``/``GET /api/v1/runs/{run_id}/exports`` to export another step (``service.export_jobs``).

Workers write the final model as one file per format at the end of training
(``workers.export``), under ``{storage}/runs/{id}/exports/step-{N}.safetensors`` / ``.pt``.
This route finds and streams that file: the service never needs torch. The file's metadata
holds the run spec (the model spec and the surgery algorithms to replay) so
``workers.export.load_model`` can rebuild the model.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from fastapi.responses import StreamingResponse
from fsspec.core import url_to_fs

from api.views import ExportRequest, ExportsPage, ExportView, RunStatus
from service.access import Role
from service.bounded_storage import DEFAULT_STORAGE_TIMEOUT_S, bounded
from service.deps import CallerDep, JobsDep, RepoDep, SettingsDep
from service.cleanup import remove_folder
from service.export_jobs import ExportRequests
from service.repository import RunNotFound
from service.json_body import ParsedBodyRoute
from service.storage_paths import EXPORT_SUFFIXES, export_url, exports_url, project_storage_url, run_url
from service.errors import VALIDATION_RESPONSES, ErrorBody
from service.routes.runs import scoped_run

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/runs", tags=["runs"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

CHUNK_BYTES = 1 << 20


def exported_steps(storage_url: str, run_id: str, fmt: str, *,
                   timeout_s: float = DEFAULT_STORAGE_TIMEOUT_S) -> list[int]:
    """The steps with an export in ``fmt``, ascending."""
    fs, folder = url_to_fs(exports_url(storage_url, run_id))
    fs.invalidate_cache(folder)
    try:
        listed = bounded(f"listing {folder}", timeout_s, fs.ls, folder, detail=False)
        names = [path.rsplit("/", 1)[-1] for path in listed]
    except FileNotFoundError:
        return []
    pattern = re.compile(rf"step-(\d+)\.{EXPORT_SUFFIXES[fmt]}$")
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


@router.get("/{run_id}/model", operation_id="get_run_model",
            responses={200: {"content": {"application/octet-stream": {}}, "description": "the model file"},
                       404: {"model": ErrorBody}})
def get_run_model(run_id: str, repo: RepoDep, caller: CallerDep, settings: SettingsDep,
                  format: Annotated[Literal["safetensors", "torch"], Query(description="file format")] = "safetensors",
                  step: Annotated[int | None, Query(ge=0, description="default: the newest export")] = None,
                  ) -> StreamingResponse:
    """The run's trained model as one file (weights consolidated from every worker), with the
    spec in its metadata. 404 while the run has not finished training, or for a step without export."""
    run = scoped_run(repo, caller, run_id, Role.VIEWER)  # 404 for an unknown run or another project's
    storage_url = project_storage_url(settings.storage_url, run.project)  # where its workers wrote
    steps = exported_steps(storage_url, run_id, format, timeout_s=settings.storage_timeout_s)
    if not steps or (step is not None and step not in steps):
        if steps:
            what = (f"no export at step {step}; exported steps: {steps} "
                    f"(POST .../exports {{\"step\": {step}}} exports it)")
        elif run.status.is_terminal and run.status is not RunStatus.COMPLETED:  # it never will have one by itself
            what = ("no exported model: a model is exported when training ends, and this run ended before; export one "
                    "of its committed checkpoints (GET .../checkpoints) with POST .../exports {\"step\": N}, "
                    "tessera export RUN --step N")
        else:
            what = "no exported model yet (the model is exported when training ends)"
        raise HTTPException(status_code=404, detail=f"run {run_id} ({run.status.value}) has {what}")
    chosen = steps[-1] if step is None else step
    fs, path = url_to_fs(export_url(storage_url, run_id, chosen, format))
    size = bounded(f"reading the size of {path}", settings.storage_timeout_s, fs.size, path)

    def chunks():
        with fs.open(path, "rb") as file:
            while data := file.read(CHUNK_BYTES):
                yield data

    filename = f"{run_id}-step-{chosen}.{EXPORT_SUFFIXES[format]}"
    return StreamingResponse(chunks(), media_type="application/octet-stream",
                             headers={"Content-Disposition": f'attachment; filename="{filename}"',
                                      "Content-Length": str(size), "X-Tessera-Step": str(chosen)})


@router.post("/{run_id}/exports", response_model=ExportView, operation_id="request_run_export",
             responses={200: {"model": ExportView, "description": "already exported (READY)"},
                        202: {"model": ExportView, "description": "a Ray job is exporting it (PENDING)"},
                        404: {"model": ErrorBody}})
def request_export(run_id: str, body: ExportRequest, response: Response, repo: RepoDep, caller: CallerDep,
                   settings: SettingsDep, jobs: JobsDep) -> ExportView:
    """Export the model of the committed checkpoint at ``step`` (a ``member`` of the run's
    project): a Ray job consolidates it; poll ``GET .../exports`` until READY, then download it
    with ``GET .../model?step=``. 404 when the run has no committed checkpoint at that step."""
    run = scoped_run(repo, caller, run_id, Role.MEMBER)
    committed = {c.step: c for c in repo.checkpoints(run_id) if c.committed}
    checkpoint = committed.get(body.step)
    if checkpoint is None or not _marker_exists(checkpoint.url, settings):
        kept = sorted(step for step, c in committed.items() if _marker_exists(c.url, settings)) if committed else []
        raise HTTPException(status_code=404, detail=f"run {run_id} has no committed checkpoint at step {body.step}; "
                                                    f"steps with one: {kept} (retention keeps checkpoint.keep_last)")
    exports = ExportRequests(project_storage_url(settings.storage_url, run.project), jobs, settings)
    view = exports.request(run_id, checkpoint, spec=run.spec, metrics=repo.eval_metrics_at(run_id, body.step))
    if view.job_id is not None:
        try:
            repo.get_run(run_id)
        except RunNotFound:  # deleted meanwhile: stop this job too, and remove what this request wrote
            try:
                jobs.stop(view.job_id)
                remove_folder(run_url(project_storage_url(settings.storage_url, run.project), run_id))
            except Exception as exc:  # the job fails on its own: its checkpoint went with the run
                log.warning("after run %s was deleted, could not stop its export job %s or remove its folder: %s",
                            run_id, view.job_id, exc)
            raise
    response.status_code = 200 if view.status == "READY" else 202
    return view


@router.get("/{run_id}/exports", response_model=ExportsPage, operation_id="list_run_exports",
            responses={404: {"model": ErrorBody}})
def list_exports(run_id: str, repo: RepoDep, caller: CallerDep, settings: SettingsDep, jobs: JobsDep) -> ExportsPage:
    """The run's exports by step: READY, PENDING (a job is consolidating the checkpoint) or FAILED."""
    run = scoped_run(repo, caller, run_id, Role.VIEWER)
    exports = ExportRequests(project_storage_url(settings.storage_url, run.project), jobs, settings)
    return ExportsPage(data=exports.list(run_id))


def _marker_exists(checkpoint_url: str, settings) -> bool:
    """Whether the checkpoint is still there (retention deletes old ones; their rows stay)."""
    fs, path = url_to_fs(checkpoint_url.rstrip("/") + "/COMMITTED")
    fs.invalidate_cache(path.rsplit("/", 1)[0])
    return bounded(f"looking for {path}", settings.storage_timeout_s, fs.exists, path)
