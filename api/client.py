"""Typed SDK over the Tessera REST API, for the CLI, notebooks, tests and workers.

    from api.client import Client
    client = Client("http://127.0.0.1:8000")
    run = client.create_run(yaml.safe_load(open("examples/digits_resnet.yaml")))
    run = client.wait(run.id)
"""

from __future__ import annotations

import os
import time
from datetime import datetime
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
from pydantic import ValidationError

from api.code_package import CodePackage, CodeView, inspect_package, pack_directory
from api.credentials import find_api_key
from api.errors import ApiError, ExportFailed, InvalidInput
from api.logs import LogsPage, SweepLogsPage
from api.run_edits import DeletionView, RunUpdate
from api.specs import RunSpec
from api.validation_errors import format_validation_errors
from api.views import (
    CatalogPage,
    CheckpointReport,
    CheckpointsPage,
    CheckpointView,
    ExportsPage,
    ExportView,
    MetricsPage,
    MetricsReport,
    NoteReport,
    RunEventsPage,
    RunsPage,
    RunStatus,
    RunView,
    StatusReport,
    SweepsPage,
    SweepStatusReport,
    SweepView,
    TrialEnd,
    TrialRegistration,
    TrialTicket,
)

API = "/api/v1"
DEFAULT_URL = "http://127.0.0.1:8000"  # the embedded service (make serve); TESSERA_URL overrides it
RETRIED_STATUSES = frozenset({502, 503, 504})  # a proxy or the service is briefly away
SUBMIT_RETRY_DELAYS_S = (0.5, 1.0, 2.0)


def _raise_for_status(response: httpx.Response) -> None:
    """An ``ApiError`` with the service's ``detail`` for a 4xx/5xx answer."""
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise ApiError(response.status_code, detail)


class Client:
    """``base_url``: the service; default ``TESSERA_URL``, else ``http://127.0.0.1:8000`` (as the
    CLI). ``api_key``: the user's key (``tsk_...``); default ``TESSERA_API_KEY``, else the key in
    ``$TESSERA_HOME/credentials`` (written by the embedded service on its first start). Worker
    and driver reports carry their own per-attempt token instead."""

    def __init__(self, base_url: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, api_key: str | None = None):
        self.base_url = (base_url or os.environ.get("TESSERA_URL") or DEFAULT_URL).rstrip("/")
        api_key = api_key or find_api_key()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        response = self._http.request(method, path, headers=headers, **kwargs)
        _raise_for_status(response)
        return response.json() if response.content else None

    # --- runs ----------------------------------------------------------------------------
    def create_run(self, spec: RunSpec | dict[str, Any], *, code: str | Path | CodePackage | None = None,
                   project: str | None = None, idempotency_key: str | None = None) -> RunView:
        """Queue a run in ``project`` (default: the key's only project, else ``default``). ``code``:
        a folder (or a ``CodePackage``) with the code that ``model.import`` names; it is packed,
        uploaded to the project unless the service has it, and recorded as the spec's ``code.digest``.

        The request carries an ``Idempotency-Key`` (``idempotency_key``, default a fresh one per
        call) and is retried with it when the answer is lost (a connection error, a timeout, a
        502/503/504): the service returns the first request's run, so a retry never makes two."""
        body = spec.model_dump(mode="json") if isinstance(spec, RunSpec) else dict(spec)
        params = {"project": project} if project is not None else None
        if code is not None:
            body = self._with_code(body, code, project=project)
        headers = {"Idempotency-Key": idempotency_key or f"sdk-{uuid.uuid4().hex}"}
        return RunView.model_validate(self._post_with_retries(f"{API}/runs", json=body, params=params,
                                                              headers=headers))

    def _with_code(self, run_body: dict[str, Any], code: str | Path | CodePackage, *,
                   project: str | None) -> dict[str, Any]:
        """A copy of ``run_body`` (a RunSpec's dict: a run's, a sweep's base) whose ``code.digest``
        names ``code``, packed and uploaded to ``project`` unless the service has it already."""
        return {**run_body, "code": {"digest": self.upload_code(code, project=project).digest}}

    def _post_with_retries(self, path: str, **kwargs: Any) -> Any:
        """POST that is safe to repeat (it carries an Idempotency-Key), retried on a lost answer."""
        for delay in (*SUBMIT_RETRY_DELAYS_S, None):
            try:
                response = self._http.request("POST", path, **kwargs)
            except httpx.TransportError:
                if delay is None:
                    raise
            else:
                if response.status_code not in RETRIED_STATUSES or delay is None:
                    _raise_for_status(response)
                    return response.json() if response.content else None
            time.sleep(delay)

    def download_model(self, run_id: str, out: str | Path, *, fmt: str = "safetensors",
                       step: int | None = None) -> tuple[int, str]:
        """Stream the run's exported model (``fmt``: safetensors or torch; ``step``: default the
        final one) to ``out``, written whole or not at all; returns (bytes, the step served)."""
        params = {"format": fmt} | ({"step": step} if step is not None else {})
        out = Path(out)
        partial = out.with_name(out.name + ".partial")
        with self._http.stream("GET", f"{API}/runs/{run_id}/model", params=params, timeout=300) as answer:
            if answer.status_code >= 400:
                answer.read()
                _raise_for_status(answer)
            size = 0
            with open(partial, "wb") as file:
                for chunk in answer.iter_bytes():
                    file.write(chunk)
                    size += len(chunk)
            partial.replace(out)
            return size, answer.headers.get("x-tessera-step", "?")

    def request_export(self, run_id: str, step: int) -> ExportView:
        """Export the model of the committed checkpoint at ``step``: READY at once if it is
        exported already, else PENDING while a Ray job consolidates it (poll ``list_exports``)."""
        return ExportView.model_validate(self._request("POST", f"{API}/runs/{run_id}/exports", json={"step": step}))

    def list_exports(self, run_id: str) -> list[ExportView]:
        """The run's exports by step (READY, PENDING or FAILED)."""
        return ExportsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/exports")).data

    def wait_export(self, run_id: str, step: int, *, timeout: float = 1800.0, poll_interval: float = 1.0) -> ExportView:
        """Request the export of ``step`` and poll until it is READY; ``ExportFailed`` if its job failed."""
        deadline = time.monotonic() + timeout
        view = self.request_export(run_id, step)
        while view.status == "PENDING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the export of run {run_id} at step {step} still PENDING after {timeout:.0f}s")
            time.sleep(poll_interval)
            view = next((v for v in self.list_exports(run_id) if v.step == step), view)
        if view.status == "FAILED":
            raise ExportFailed(view.error or f"the export of run {run_id} at step {step} failed")
        return view

    # --- code packages -------------------------------------------------------------------
    def upload_code(self, code: str | Path | CodePackage, *, project: str | None = None) -> CodeView:
        """Pack ``code`` (a folder; see ``api.code_package``) and upload it to ``project``, unless
        the project already stores a package with its digest (then nothing is sent)."""
        package = code if isinstance(code, CodePackage) else pack_directory(code)
        if self.has_code(package.digest, project=project):
            return inspect_package(package.data)
        params = {"digest": package.digest, **({"project": project} if project is not None else {})}
        return CodeView.model_validate(self._request(
            "POST", f"{API}/code", params=params, content=package.data, headers={"Content-Type": "application/zip"}))

    def download_code(self, digest: str, out: str | Path, *, project: str | None = None) -> int:
        """Stream the package ``digest`` of ``project`` (default: the key's only project, else
        ``default``) to ``out``, written whole or not at all: its sha256 is checked before it
        takes ``out``'s name (``CodePackageError`` if it differs); returns its size in bytes."""
        import hashlib

        from api.code_package import CodePackageError

        out = Path(out)
        partial = out.with_name(f"{out.name}.{uuid.uuid4().hex[:8]}.partial")
        params = {"project": project} if project is not None else None
        try:
            with self._http.stream("GET", f"{API}/code/{digest}/package", params=params, timeout=300) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    _raise_for_status(answer)
                sha256, size = hashlib.sha256(), 0
                with open(partial, "wb") as file:
                    for chunk in answer.iter_bytes():
                        file.write(chunk)
                        sha256.update(chunk)
                        size += len(chunk)
            if sha256.hexdigest() != digest:
                raise CodePackageError(f"code package {digest}: the service sent {size} bytes whose sha256 is "
                                       f"{sha256.hexdigest()} (cut short or changed); nothing written to {out}")
            partial.replace(out)
            return size
        finally:
            partial.unlink(missing_ok=True)

    def has_code(self, digest: str, *, project: str | None = None) -> bool:
        """Whether ``project`` stores a package with this digest (a HEAD request: no body)."""
        response = self._http.head(f"{API}/code/{digest}", params={"project": project} if project else None)
        if response.status_code not in (200, 404):
            raise ApiError(response.status_code, response.reason_phrase)
        return response.status_code == 200

    def get_code(self, digest: str) -> CodeView | None:
        """The stored package with this digest, or None."""
        try:
            return CodeView.model_validate(self._request("GET", f"{API}/code/{digest}"))
        except ApiError as exc:
            if exc.status_code == 404:
                return None
            raise

    def get_run(self, run_id: str) -> RunView:
        return RunView.model_validate(self._request("GET", f"{API}/runs/{run_id}"))

    def list_runs(self, *, status: RunStatus | str | None = None, sweep_id: str | None = None, limit: int = 50,
                  cursor: str | None = None, tag: str | None = None, name: str | None = None,
                  created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                  archived: bool | str = False, order_by: str | None = None, project: str | None = None) -> RunsPage:
        """Runs newest first (``order_by="best:eval/accuracy"``: that metric's best value first);
        ``sweep_id`` keeps only that sweep's trials, ``tag`` runs with that tag, ``name`` runs
        whose name contains it, ``project`` that project's runs (default: every project of the
        key; a project the key has no role in lists none); ``archived``: False (default) hides
        archived runs, True shows only them, ``"all"`` both. Pass ``next_cursor`` back as
        ``cursor`` with the same filters."""
        params: dict[str, Any] = {"limit": limit, "archived": str(archived).lower()}
        if status is not None:
            params["status"] = RunStatus.of(status).value
        for key, value in (("sweep_id", sweep_id), ("cursor", cursor), ("tag", tag), ("name", name),
                           ("order_by", order_by), ("project", project)):
            if value is not None:
                params[key] = value
        for key, when in (("created_after", created_after), ("created_before", created_before)):
            if when is not None:
                params[key] = when.isoformat() if isinstance(when, datetime) else when
        return RunsPage.model_validate(self._request("GET", f"{API}/runs", params=params))

    def iter_runs(self, *, status: RunStatus | str | None = None, sweep_id: str | None = None,
                  **filters: Any) -> Iterator[RunView]:
        """Every run ``list_runs`` would page through with the same filters."""
        cursor = None
        while True:
            page = self.list_runs(status=status, sweep_id=sweep_id, cursor=cursor, **filters)
            yield from page.data
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def update_run(self, run_id: str, *, tags: list[str] | None = None, notes: str | None = None) -> RunView:
        """Replace the run's tags and/or notes (None leaves a field as it is; ``notes=""`` clears).
        ``InvalidInput``, before anything is sent, for a tag or note the service would refuse."""
        fields = {"tags": tags, "notes": notes}
        try:
            body = RunUpdate(**fields).model_dump(exclude_none=True)
        except ValidationError as exc:
            raise InvalidInput(format_validation_errors(exc.errors(), fields, None)) from exc
        return RunView.model_validate(self._request("PATCH", f"{API}/runs/{run_id}", json=body))

    def delete_run(self, run_id: str) -> DeletionView:
        """Delete an ended run with its checkpoints, logs and exports (409 while it is live)."""
        return DeletionView.model_validate(self._request("DELETE", f"{API}/runs/{run_id}"))

    def archive_run(self, run_id: str, *, archived: bool = True) -> RunView:
        """Hide the run from default lists (``archived=False``: show it again)."""
        action = "archive" if archived else "unarchive"
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/{action}"))

    def delete_sweep(self, sweep_id: str) -> DeletionView:
        """Delete an ended sweep with its trials and their storage (409 while it is live)."""
        return DeletionView.model_validate(self._request("DELETE", f"{API}/sweeps/{sweep_id}"))

    def archive_sweep(self, sweep_id: str, *, archived: bool = True) -> SweepView:
        """Hide the sweep from default lists (``archived=False``: show it again)."""
        action = "archive" if archived else "unarchive"
        return SweepView.model_validate(self._request("POST", f"{API}/sweeps/{sweep_id}/{action}"))

    def cancel_run(self, run_id: str) -> RunView:
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/cancel"))

    def resume_run(self, run_id: str, num_workers: int | None = None) -> RunView:
        """Re-queue a FAILED, CANCELED or STOPPED run; it resumes from its newest committed checkpoint,
        optionally on ``num_workers`` workers (409 if it is not one of these)."""
        body = {"num_workers": num_workers} if num_workers is not None else {}
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/resume", json=body))

    # --- lineage (fork and continue) --------------------------------------------------------
    def fork(self, run_id: str, patch: dict[str, Any] | None = None, *, from_: str | int = "latest") -> RunView:
        """A new run from ``run_id``: its spec with ``patch`` merged in (JSON Merge Patch, e.g.
        ``{"optimizer": {"lr": 0.05}}``), starting from the parent's ``"latest"`` committed
        checkpoint, the one at batch ``from_`` (an int), or ``"scratch"``. 422 names the field of
        a change the checkpoint cannot survive (model, surgery algorithms, data shapes)."""
        source: Any = {"step": from_} if isinstance(from_, int) else from_
        body = {"patch": patch or {}, "from": source}
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/fork", json=body))

    def continue_run(self, run_id: str, max_duration: str) -> RunView:
        """Train a COMPLETED run on to a longer ``max_duration`` (same unit, e.g. ``"20ep"``) as its
        next attempt, resuming from its newest committed checkpoint (409 unless COMPLETED)."""
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/continue",
                                                    json={"max_duration": max_duration}))

    def run_children(self, run_id: str) -> list[RunView]:
        """The runs forked from ``run_id``, oldest first."""
        return RunsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/children")).data

    def list_checkpoints(self, run_id: str) -> list[CheckpointView]:
        """The run's checkpoints, oldest first (committed or failed)."""
        return CheckpointsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/checkpoints")).data

    def run_events(self, run_id: str) -> RunEventsPage:
        return RunEventsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/events"))

    def metrics(self, run_id: str, *, after: int = 0, limit: int = 5000, all_attempts: bool = False) -> MetricsPage:
        """One page of points; with ``all_attempts`` also those a resumed attempt superseded."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if all_attempts:
            params["all_attempts"] = "true"
        return MetricsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/metrics", params=params))

    def logs(self, run_id: str, *, attempt: int | None = None, after: int = 0) -> LogsPage:
        """One page of an attempt's log from byte ``after`` (default: the newest attempt)."""
        params = {"after": after} | ({"attempt": attempt} if attempt is not None else {})
        return LogsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/logs", params=params))

    def sweep_logs(self, sweep_id: str, *, attempt: int | None = None, after: int = 0) -> SweepLogsPage:
        """One page of a sweep driver attempt's log (the Tune driver's output and every
        trial's) from byte ``after`` (default: the newest attempt)."""
        params = {"after": after} | ({"attempt": attempt} if attempt is not None else {})
        return SweepLogsPage.model_validate(self._request("GET", f"{API}/sweeps/{sweep_id}/logs", params=params))

    def wait(self, run_id: str, *, timeout: float = 600.0, poll_interval: float = 0.5) -> RunView:
        """Poll until the run reaches a terminal status; raise ``TimeoutError`` otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if run.status.is_terminal:
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} still {run.status.value} after {timeout:.0f}s")
            time.sleep(poll_interval)

    # --- sweeps --------------------------------------------------------------------------
    def create_sweep(self, spec: Any, *, code: str | Path | CodePackage | None = None, driver: str = "service",
                     project: str | None = None, idempotency_key: str | None = None) -> SweepView:
        """Store a sweep (a ``SweepSpec`` or its dict). ``driver="service"``: the service runs
        its Ray Tune driver as a Ray job. ``driver="external"``: the caller drives it (see
        ``workers.tune.run_sweep``); the answer then carries ``driver_token``. ``code``: a folder
        (or a ``CodePackage``) with the code the base's ``model.import`` names; it is packed,
        uploaded to the project unless the service has it, and recorded as ``base.code.digest``,
        which every trial's spec inherits, as ``create_run`` does for a run.

        Retried with its ``Idempotency-Key`` (default a fresh one per call) when the answer is
        lost, as ``create_run`` is: a retry never makes two sweeps (an external sweep's retry
        gets a new ``driver_token``, and the lost answer's stops working)."""
        body = spec.model_dump(mode="json") if hasattr(spec, "model_dump") else spec
        if code is not None:
            base = body.get("base") if isinstance(body, dict) else None
            if not isinstance(base, dict):
                from api.validation_errors import field_error

                raise InvalidInput([field_error("base", ["body", "base"], "code= records the package as "
                                                "base.code.digest: the sweep needs its base RunSpec, a mapping",
                                                base)])
            body = {**body, "base": self._with_code(base, code, project=project)}
        params = {"driver": driver, **({"project": project} if project is not None else {})}
        headers = {"Idempotency-Key": idempotency_key or f"sdk-{uuid.uuid4().hex}"}
        return SweepView.model_validate(self._post_with_retries(f"{API}/sweeps", json=body, params=params,
                                                                headers=headers))

    def get_sweep(self, sweep_id: str) -> SweepView:
        return SweepView.model_validate(self._request("GET", f"{API}/sweeps/{sweep_id}"))

    def list_sweeps(self, *, limit: int = 50, archived: bool | str = False, project: str | None = None) -> SweepsPage:
        """The newest ``limit`` sweeps; ``project``: that project's only (default: every project
        of the key; a project the key has no role in lists none); ``archived``: False (default)
        hides archived sweeps, True shows only them, ``"all"`` both."""
        params: dict[str, Any] = {"limit": limit, "archived": str(archived).lower()}
        if project is not None:
            params["project"] = project
        return SweepsPage.model_validate(self._request("GET", f"{API}/sweeps", params=params))

    def cancel_sweep(self, sweep_id: str) -> SweepView:
        return SweepView.model_validate(self._request("POST", f"{API}/sweeps/{sweep_id}/cancel"))

    def wait_sweep(self, sweep_id: str, *, timeout: float = 3600.0, poll_interval: float = 1.0,
                   on_poll: Any = None) -> SweepView:
        """Poll until the sweep ends; ``on_poll(view)`` sees every answer (a progress bar)."""
        deadline = time.monotonic() + timeout
        while True:
            sweep = self.get_sweep(sweep_id)
            if on_poll is not None:
                on_poll(sweep)
            if sweep.status.is_terminal:
                return sweep
            if time.monotonic() > deadline:
                raise TimeoutError(f"sweep {sweep_id} still {sweep.status.value} after {timeout:.0f}s")
            time.sleep(poll_interval)

    # --- sweep driver reports (per-attempt sweep token) ----------------------------------
    def report_sweep_status(self, sweep_id: str, token: str, report: SweepStatusReport) -> SweepView:
        return SweepView.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/report/status", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def register_trial(self, sweep_id: str, token: str, registration: TrialRegistration) -> TrialTicket:
        """Create the trial's run (or start its next attempt); returns its run id and run token."""
        return TrialTicket.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/trials", json=registration.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def end_trial(self, sweep_id: str, token: str, trial_id: str, end: TrialEnd) -> RunView:
        """Tell the service that Tune stopped (``stopped``) or lost (``failed``) a trial."""
        return RunView.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/trials/{trial_id}/end", json=end.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    # --- keys and projects ---------------------------------------------------------------
    def me(self) -> dict[str, Any]:
        """The calling key: ``key_id``, ``roles`` per project, and the ``projects`` it sees."""
        return self._request("GET", f"{API}/me")

    def create_key(self, project: str, role: str = "member", name: str = "key") -> dict[str, Any]:
        """A new key for ``project``; the answer's ``key`` is the secret, shown only once."""
        return self._request("POST", f"{API}/keys", json={"project": project, "role": role, "name": name})

    def list_keys(self) -> list[dict[str, Any]]:
        return self._request("GET", f"{API}/keys")["data"]

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        return self._request("DELETE", f"{API}/keys/{key_id}")

    def create_project(self, name: str) -> dict[str, Any]:
        return self._request("POST", f"{API}/projects", json={"name": name})

    def list_projects(self) -> list[dict[str, Any]]:
        return self._request("GET", f"{API}/projects")["data"]

    def set_quota(self, project: str, **quota: Any) -> dict[str, Any]:
        """Replace ``project``'s quotas (``max_running_runs``, ``max_workers``, ``max_gpus``,
        ``default_max_wall_time_s``, ``max_wall_time_cap_s``, ``max_duration_caps``): one left
        out is no limit."""
        return self._request("PUT", f"{API}/projects/{project}/quota", json=quota)

    def update_quota(self, project: str, **changes: Any) -> dict[str, Any]:
        """Change only the quotas named (the fields of ``set_quota``; None: no limit), keeping
        the rest."""
        return self._request("PATCH", f"{API}/projects/{project}/quota", json=changes)

    # --- catalog -------------------------------------------------------------------------
    def algorithms(self) -> CatalogPage:
        return CatalogPage.model_validate(self._request("GET", f"{API}/algorithms"))

    def models(self) -> CatalogPage:
        return CatalogPage.model_validate(self._request("GET", f"{API}/models"))

    def datasets(self) -> CatalogPage:
        return CatalogPage.model_validate(self._request("GET", f"{API}/datasets"))

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    # --- worker reports (per-attempt bearer token) ---------------------------------------
    def report_status(self, run_id: str, token: str, report: StatusReport) -> RunView:
        return RunView.model_validate(self._request(
            "POST", f"{API}/runs/{run_id}/report/status", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def report_metrics(self, run_id: str, token: str, report: MetricsReport) -> int:
        """Post a batch of metric points; returns how many the service stored."""
        body = self._request("POST", f"{API}/runs/{run_id}/report/metrics", json=report.model_dump(mode="json"),
                             headers={"Authorization": f"Bearer {token}"})
        return int(body["stored"])

    def report_note(self, run_id: str, token: str, report: NoteReport) -> RunView:
        """Record a worker's note on its run as a run event."""
        return RunView.model_validate(self._request(
            "POST", f"{API}/runs/{run_id}/report/note", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def report_checkpoint(self, run_id: str, token: str, report: CheckpointReport) -> CheckpointView:
        """Tell the service about a committed (or failed) checkpoint."""
        return CheckpointView.model_validate(self._request(
            "POST", f"{API}/runs/{run_id}/report/checkpoint", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))
