"""Typed SDK over the Tessera REST API, for the CLI, notebooks, tests and workers.

    from api.client import Client
    client = Client("http://127.0.0.1:8000")
    run = client.create_run(yaml.safe_load(open("examples/digits_resnet.yaml")))
    run = client.wait(run.id)
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
from pydantic import ValidationError

from api.code_package import CodePackage, CodeView, inspect_package, pack_directory, with_code_digest
from api.credentials import find_api_key, find_service_url
from api.errors import ApiError, ExportFailed, InvalidInput
from api.logs import LogsPage, SweepLogsPage
from api.run_edits import DeletionView, RunUpdate, apply_tag_edits
from api.specs import RunSpec
from api.validation_errors import field_error, format_validation_errors
from api.views import (
    CatalogPage,
    CheckpointReport,
    CheckpointsPage,
    CheckpointView,
    ExportsPage,
    ExportView,
    MetricPoint,
    MetricsPage,
    MetricsReport,
    NoteReport,
    RunEventsPage,
    RunsPage,
    RunStatus,
    RunView,
    StatusReport,
    SweepsPage,
    SweepStatus,
    SweepStatusReport,
    SweepView,
    TrialEnd,
    TrialRegistration,
    TrialTicket,
)

API = "/api/v1"
MAX_CHILDREN = 500  # GET /runs/{id}/children's largest page
DEFAULT_URL = "http://127.0.0.1:8000"  # the embedded service (make serve) on its default port
RETRIED_STATUSES = frozenset({502, 503, 504})  # a proxy or the service is briefly away
SUBMIT_RETRY_DELAYS_S = (0.5, 1.0, 2.0)
METRICS_PAGE_SIZE = 10_000  # points per request of iter_metrics (the dashboard's page; the route allows 100,000)


def _raise_for_status(response: httpx.Response) -> None:
    """An ``ApiError`` with the service's ``detail`` for a 4xx/5xx answer."""
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise ApiError(response.status_code, detail)


def _every_item(list_page: Callable[..., Any], **query: Any) -> Iterator[Any]:
    """Every item of a keyset-paged list (``list_runs``, ``list_sweeps``): ``list_page(cursor=...,
    **query)`` page after page until one has no ``next_cursor``."""
    cursor = None
    while True:
        page = list_page(cursor=cursor, **query)
        yield from page.data
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


def service_url(base_url: str | None = None) -> str:
    """``base_url``, else ``TESSERA_URL``, else the URL in the nearest credentials file
    (``api.credentials.find_service_url``), else ``DEFAULT_URL``; without a trailing slash."""
    return (base_url or find_service_url() or DEFAULT_URL).rstrip("/")


class Client:
    """``base_url``: the service; default ``TESSERA_URL``, else the URL in the credentials file
    (``api.credentials.find_credentials``, which the embedded service rewrites on every start),
    else ``http://127.0.0.1:8000`` (as the CLI). ``api_key``: the user's key (``tsk_...``);
    default ``TESSERA_API_KEY``, else the key in that credentials file. Worker
    and driver reports carry their own per-attempt token instead.

    Errors: an answer of 400 or more raises ``api.errors.ApiError``; its ``status_code`` is the
    HTTP status and its ``detail`` the service's: a string for most (401: no key, or an unknown
    or revoked one; 403: your role in the project is too low; 404: no such object in your
    key's projects (another project's reads as missing); 409: the object's state refuses it,
    e.g. cancelling a run that ended), a list of ``{"field", "loc", "msg", "input"}`` items for a 422
    (invalid input, each item naming its field). ``api.errors.InvalidInput`` (a ``ValueError``,
    with the same ``detail`` items) is input the SDK refuses before sending anything. The
    ``wait*`` methods raise ``TimeoutError``; a service that cannot be reached raises
    ``httpx.TransportError`` (``httpx.ConnectError``, ``httpx.ReadTimeout``, ...). Each method
    below names the statuses a user's mistake gets."""

    def __init__(self, base_url: str | None = None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None, api_key: str | None = None):
        self.base_url = service_url(base_url)
        api_key = api_key or find_api_key()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport, headers=headers)

    def close(self) -> None:
        """Close the HTTP connections (``with Client(...) as client:`` does it on leaving)."""
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
        502/503/504): the service returns the first request's run, so a retry never makes two.

        Returns the new run's view (QUEUED), ``replayed`` false; with an ``idempotency_key`` an
        earlier request used, that request's run, ``replayed`` true. Without an
        ``idempotency_key`` a replay can only be this call's own retry, so ``replayed`` is false;
        with one, a replay answered to a retry is None (unknown: this call's lost first try may
        have made the run). ``ApiError`` 422 naming the field for an invalid
        spec (also a data root outside the data directories, a code digest the project lacks, a
        size the cluster can never hold, a project cap, an ``idempotency_key`` reused for another
        spec); 404 for a ``project`` the key has no role in, 403 for a viewer there.
        ``CodePackageError`` for a ``code`` folder that cannot be packed."""
        body = spec.model_dump(mode="json") if isinstance(spec, RunSpec) else dict(spec)
        params = {"project": project} if project is not None else None
        if code is not None:
            body = self._with_code(body, code, project=project)
        headers = {"Idempotency-Key": idempotency_key or f"sdk-{uuid.uuid4().hex}"}
        answer = self._post_with_retries(f"{API}/runs", json=body, params=params, headers=headers)
        return RunView.model_validate(self._made_here(answer, idempotency_key))

    def _with_code(self, run_body: dict[str, Any], code: str | Path | CodePackage, *,
                   project: str | None) -> dict[str, Any]:
        """A copy of ``run_body`` (a RunSpec's dict: a run's, a sweep's base) whose ``code.digest``
        names ``code``, packed and uploaded to ``project`` unless the service has it already; its
        ``code.requirements`` are kept."""
        return with_code_digest(run_body, self.upload_code(code, project=project).digest)

    def _post_with_retries(self, path: str, **kwargs: Any) -> tuple[Any, bool]:
        """POST that is safe to repeat (it carries an Idempotency-Key), retried on a lost answer:
        (the answer's JSON, whether an earlier try may have reached the service)."""
        retried = False
        for delay in (*SUBMIT_RETRY_DELAYS_S, None):
            try:
                response = self._http.request("POST", path, **kwargs)
            except httpx.TransportError:
                if delay is None:
                    raise
            else:
                if response.status_code not in RETRIED_STATUSES or delay is None:
                    _raise_for_status(response)
                    return (response.json() if response.content else None), retried
            retried = True
            time.sleep(delay)
        raise AssertionError("unreachable: the last try returns or raises")

    @staticmethod
    def _made_here(answer: tuple[Any, bool], user_key: str | None) -> dict[str, Any]:
        """A create's answer with ``replayed`` as this call knows it: false for a fresh key of
        its own (a replay is its own retry's), None (unknown) for the caller's key when a retry
        was answered as a replay (a lost first answer, or an earlier request with the key)."""
        body, retried = answer
        if isinstance(body, dict) and body.get("replayed"):
            if user_key is None:
                return {**body, "replayed": False}
            if retried:
                return {**body, "replayed": None}
        return body

    def download_model(self, run_id: str, out: str | Path, *, fmt: str = "safetensors",
                       step: int | None = None) -> tuple[int, str]:
        """Stream the run's exported model (``fmt``: safetensors or torch; ``step``: default the
        newest export) to the file ``out``, written whole or not at all (a broken download leaves
        nothing behind). Returns (bytes written, the step served as a string, from the answer's
        ``X-Tessera-Step`` header; ``"?"`` if the header did not arrive, e.g. a proxy dropped it).

        ``InvalidInput`` naming ``out``, before any request, if ``out`` is a directory.
        ``ApiError`` 404 for an unknown run, a run with no exported model yet (exported when
        training ends), or a ``step`` without an export (``request_export`` / ``wait_export``
        makes one); 422 for a ``fmt`` other than safetensors or torch."""
        params = {"format": fmt} | ({"step": step} if step is not None else {})
        size, headers = self._download(f"{API}/runs/{run_id}/model", out, params=params)
        return size, headers.get("x-tessera-step", "?")

    def _download(self, path: str, out: str | Path, *, params: dict[str, Any] | None = None,
                  check: Callable[[int, str], None] | None = None) -> tuple[int, httpx.Headers]:
        """GET ``path`` streamed into a partial file of its own next to ``out`` (a unique name:
        two downloads to one ``out`` do not mix), renamed to ``out`` once whole; on any error (an
        error answer, a broken stream, ``check`` raising) it is deleted and ``out`` is left as it
        was. ``check(size, sha256 hex)`` runs before the rename. Returns (size, the answer's
        headers). ``InvalidInput`` before any request if ``out`` is a directory."""
        out = Path(out)
        if out.is_dir():
            raise InvalidInput([field_error("out", ["out"], f"{out} is a directory; pass the path of the file "
                                                            "to write (in it, or elsewhere)", str(out))])
        partial = out.with_name(f"{out.name}.{uuid.uuid4().hex[:8]}.partial")
        try:
            with open(partial, "wb") as file, \
                    self._http.stream("GET", path, params=params, timeout=300) as answer:
                if answer.status_code >= 400:
                    answer.read()
                    _raise_for_status(answer)
                sha256 = hashlib.sha256() if check is not None else None
                size = 0
                for chunk in answer.iter_bytes():
                    file.write(chunk)
                    if sha256 is not None:
                        sha256.update(chunk)
                    size += len(chunk)
                headers = answer.headers
            if check is not None and sha256 is not None:
                check(size, sha256.hexdigest())
            partial.replace(out)
            return size, headers
        finally:
            partial.unlink(missing_ok=True)

    def request_export(self, run_id: str, step: int) -> ExportView:
        """Export the model of the committed checkpoint at ``step``: READY at once if it is
        exported already, else PENDING while a Ray job consolidates it (poll ``list_exports``).
        ``ApiError`` 404 for an unknown run or no committed checkpoint at ``step`` (the detail
        lists the steps with one); 403 for a viewer; 422 for a negative ``step``."""
        return ExportView.model_validate(self._request("POST", f"{API}/runs/{run_id}/exports", json={"step": step}))

    def list_exports(self, run_id: str) -> list[ExportView]:
        """The run's exports by step (READY, PENDING or FAILED). ``ApiError`` 404 for an unknown run."""
        return ExportsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/exports")).data

    def wait_export(self, run_id: str, step: int, *, timeout: float = 1800.0, poll_interval: float = 1.0) -> ExportView:
        """Request the export of ``step`` and poll until it is READY; returns its view.
        ``ExportFailed`` (with the job's error) if its job failed; ``TimeoutError`` if still
        PENDING after ``timeout`` seconds; ``ApiError`` as ``request_export``."""
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
        the project already stores a package with its digest (then nothing is sent); returns the
        stored package's view. ``CodePackageError`` for a folder that cannot be packed (not a
        folder, too large, ...); ``ApiError`` 422 for a package the service refuses (the message
        says why), 413 above its size cap, 404 for a ``project`` the key has no role in, 403 for
        a viewer there."""
        package = code if isinstance(code, CodePackage) else pack_directory(code)
        if self.has_code(package.digest, project=project):
            return inspect_package(package.data)
        params = {"digest": package.digest, **({"project": project} if project is not None else {})}
        return CodeView.model_validate(self._request(
            "POST", f"{API}/code", params=params, content=package.data, headers={"Content-Type": "application/zip"}))

    def download_code(self, digest: str, out: str | Path, *, project: str | None = None) -> int:
        """Stream the package ``digest`` of ``project`` (default: the key's only project, else
        ``default``) to the file ``out``, written whole or not at all: its sha256 is checked
        before it takes ``out``'s name (``CodePackageError`` if it differs); returns its size in
        bytes. ``InvalidInput`` naming ``out``, before any request, if ``out`` is a directory;
        ``ApiError`` 404 if the project has no such package (or the key has no role in it)."""
        from api.code_package import CodePackageError

        def same_digest(size: int, sha256: str) -> None:
            if sha256 != digest:
                raise CodePackageError(f"code package {digest}: the service sent {size} bytes whose sha256 is "
                                       f"{sha256} (cut short or changed); nothing written to {out}")

        params = {"project": project} if project is not None else None
        return self._download(f"{API}/code/{digest}/package", out, params=params, check=same_digest)[0]

    def has_code(self, digest: str, *, project: str | None = None) -> bool:
        """Whether ``project`` stores a package with this digest (a HEAD request: no body); a
        project the key has no role in answers False. ``ApiError`` for any answer but 200 or 404
        (401: no valid key)."""
        response = self._http.head(f"{API}/code/{digest}", params={"project": project} if project else None)
        if response.status_code not in (200, 404):
            raise ApiError(response.status_code, response.reason_phrase)
        return response.status_code == 200

    def get_code(self, digest: str) -> CodeView | None:
        """The stored package with this digest in the key's default project, or None (a 404);
        ``ApiError`` for other refusals (401)."""
        try:
            return CodeView.model_validate(self._request("GET", f"{API}/code/{digest}"))
        except ApiError as exc:
            if exc.status_code == 404:
                return None
            raise

    def get_run(self, run_id: str) -> RunView:
        """The run's view (status, spec, summary, tags; ``queue`` while QUEUED). ``ApiError`` 404
        for a run that is not in one of your key's projects (unknown, or another project's)."""
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
        ``cursor`` with the same filters. Returns one page (``data``, ``next_cursor``: None on
        the last). ``ApiError`` 422 naming the field for a bad ``order_by`` (not
        ``best:<key>``), ``cursor``, time bound or ``limit`` (1-500); ``ValueError`` for an
        unknown ``status``, before sending."""
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
        """Every run ``list_runs`` would page through with the same filters (a generator: pages
        are fetched as you iterate); raises as ``list_runs``."""
        yield from _every_item(self.list_runs, status=status, sweep_id=sweep_id, **filters)

    def update_run(self, run_id: str, *, tags: list[str] | None = None, notes: str | None = None) -> RunView:
        """Replace the run's tags and/or notes (None leaves a field as it is; ``notes=""`` clears);
        returns the updated view. ``add_tags``/``remove_tags`` edit the tags instead.
        ``InvalidInput``, before anything is sent, for a tag or note the service would refuse;
        ``ApiError`` 404 for an unknown run, 403 for a viewer."""
        fields = {"tags": tags, "notes": notes}
        try:
            body = RunUpdate(**fields).model_dump(exclude_none=True)
        except ValidationError as exc:
            raise InvalidInput(format_validation_errors(exc.errors(), fields, None)) from exc
        return RunView.model_validate(self._request("PATCH", f"{API}/runs/{run_id}", json=body))

    def add_tags(self, run_id: str, *tags: str) -> RunView:
        """Add ``tags`` to the run's (those it has already are kept where they are; new ones go
        last), as ``tessera tag RUN +a +b`` does; returns the updated view. It reads the run's
        tags and writes the new list back, so a change made between the two is overwritten.
        ``InvalidInput``, before the write, for an empty or malformed tag or more than 32;
        ``ApiError`` 404 for an unknown run, 403 for a viewer."""
        return self._edit_tags(run_id, [f"+{tag}" for tag in tags])

    def remove_tags(self, run_id: str, *tags: str) -> RunView:
        """Remove ``tags`` from the run's (one it does not have is ignored), as ``tessera tag RUN
        -a -b`` does; returns the updated view. Read then written back, as ``add_tags``.
        ``InvalidInput`` for an empty tag; ``ApiError`` 404 for an unknown run, 403 for a viewer."""
        return self._edit_tags(run_id, [f"-{tag}" for tag in tags])

    def _edit_tags(self, run_id: str, edits: list[str]) -> RunView:
        """The run's tags after ``edits`` (``+name``/``-name``: ``api.run_edits.apply_tag_edits``), sent."""
        try:
            tags = apply_tag_edits(self.get_run(run_id).tags, edits)
        except ValueError as exc:
            raise InvalidInput([field_error("tags", ["tags"], str(exc), edits)]) from exc
        return self.update_run(run_id, tags=tags)

    def delete_run(self, run_id: str) -> DeletionView:
        """Delete an ended run with its checkpoints, logs and exports; returns what was removed.
        ``ApiError`` 409 while it is live (cancel it first) or its sweep is, 404 for an unknown
        run, 403 for a viewer, 503 if storage refused (retrying deletes what is left)."""
        return DeletionView.model_validate(self._request("DELETE", f"{API}/runs/{run_id}"))

    def archive_run(self, run_id: str, *, archived: bool = True) -> RunView:
        """Hide the run from default lists (``archived=False``: show it again); any status.
        Returns its view. ``ApiError`` 404 for an unknown run, 403 for a viewer."""
        action = "archive" if archived else "unarchive"
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/{action}"))

    def delete_sweep(self, sweep_id: str) -> DeletionView:
        """Delete an ended sweep with its trials and their storage; returns what was removed.
        ``ApiError`` 409 while it or a trial is live (cancel it first), 404 for an unknown
        sweep, 403 for a viewer, 503 if storage refused."""
        return DeletionView.model_validate(self._request("DELETE", f"{API}/sweeps/{sweep_id}"))

    def archive_sweep(self, sweep_id: str, *, archived: bool = True) -> SweepView:
        """Hide the sweep from default lists (``archived=False``: show it again); returns its
        view. ``ApiError`` 404 for an unknown sweep, 403 for a viewer."""
        action = "archive" if archived else "unarchive"
        return SweepView.model_validate(self._request("POST", f"{API}/sweeps/{sweep_id}/{action}"))

    def cancel_run(self, run_id: str) -> RunView:
        """Ask the run to stop; returns its view, CANCELING until its Ray job is stopped, then
        CANCELED. ``ApiError`` 409 if it has ended already or is an active trial of a sweep
        (cancel the sweep), 404 for an unknown run, 403 for a viewer."""
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/cancel"))

    def resume_run(self, run_id: str, *, num_workers: int | None = None) -> RunView:
        """Re-queue a FAILED, CANCELED or STOPPED run as its next attempt; it resumes from its
        newest committed checkpoint, optionally on ``num_workers`` workers (the checkpoint
        reshards). Returns its view (QUEUED). ``ApiError`` 409 if it is in another status, 422
        naming ``num_workers`` for a count outside 1-1024 or one the spec cannot take, 404 for
        an unknown run, 403 for a viewer."""
        body = {"num_workers": num_workers} if num_workers is not None else {}
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/resume", json=body))

    # --- lineage (fork and continue) --------------------------------------------------------
    def fork(self, run_id: str, patch: dict[str, Any] | None = None, *, from_: str | int = "latest") -> RunView:
        """A new run from ``run_id``: its spec with ``patch`` merged in (JSON Merge Patch, e.g.
        ``{"optimizer": {"lr": 0.05}}``), starting from the parent's ``"latest"`` committed
        checkpoint, the one at batch ``from_`` (an int), or ``"scratch"``. Returns the child's
        view (QUEUED). ``ApiError`` 422 naming the field of a patch that does not validate, of a
        change the checkpoint cannot survive (model, surgery algorithms, data shapes), or of a
        checkpoint that is not there; 404 for an unknown run, 403 for a viewer."""
        source: Any = {"step": from_} if isinstance(from_, int) else from_
        body = {"patch": patch or {}, "from": source}
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/fork", json=body))

    def continue_run(self, run_id: str, max_duration: str) -> RunView:
        """Train a COMPLETED run on to a longer ``max_duration`` (same unit, e.g. ``"20ep"``) as its
        next attempt, resuming from its newest committed checkpoint; returns its view (QUEUED).
        ``ApiError`` 409 unless it is COMPLETED, 422 naming ``max_duration`` for one that is not
        longer or is past the project's cap, 404 for an unknown run, 403 for a viewer."""
        return RunView.model_validate(self._request("POST", f"{API}/runs/{run_id}/continue",
                                                    json={"max_duration": max_duration}))

    def run_children(self, run_id: str, *, limit: int = MAX_CHILDREN) -> list[RunView]:
        """The first ``limit`` runs forked from ``run_id`` (at most ``MAX_CHILDREN``, 500), oldest
        first. ``ApiError`` 404 for an unknown run, 422 for a ``limit`` out of range."""
        return RunsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/children",
                                                     params={"limit": limit})).data

    def list_checkpoints(self, run_id: str) -> list[CheckpointView]:
        """The run's checkpoints, oldest first (committed or failed: check ``committed``).
        ``ApiError`` 404 for an unknown run."""
        return CheckpointsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/checkpoints")).data

    def run_events(self, run_id: str) -> RunEventsPage:
        """Every status change of the run, oldest first, with its attempt and reason (``data``).
        ``ApiError`` 404 for an unknown run."""
        return RunEventsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/events"))

    def metrics(self, run_id: str, *, after: int = 0, limit: int = 5000, all_attempts: bool = False,
                key: str | None = None) -> MetricsPage:
        """One page: up to ``limit`` points with ``seq`` above ``after``, oldest first, and
        ``last_seq`` to pass back as ``after`` (``iter_metrics`` pages through them all); with
        ``all_attempts`` also those a resumed attempt superseded; with ``key`` only that key's.
        ``ApiError`` 404 for an unknown run, 422 naming ``after`` (negative) or ``limit``
        (outside 1-100,000)."""
        params: dict[str, Any] = {"after": after, "limit": limit}
        if all_attempts:
            params["all_attempts"] = "true"
        if key is not None:
            params["key"] = key
        return MetricsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/metrics", params=params))

    def iter_metrics(self, run_id: str, *, key: str | None = None, page_size: int = METRICS_PAGE_SIZE,
                     all_attempts: bool = False) -> Iterator[MetricPoint]:
        """Every metric point of the run, oldest first (by ``seq``, the order they were
        reported), fetched ``page_size`` points a request as you iterate; with ``key`` only that
        key's points (filtered by the service, and here too: a service older than the route's
        ``key`` sends every key).
        ``all_attempts`` as ``metrics``. ``ApiError`` 404 for an unknown run, 422 naming
        ``limit`` for a ``page_size`` outside 1-100,000."""
        after = 0
        while True:
            page = self.metrics(run_id, after=after, limit=page_size, all_attempts=all_attempts, key=key)
            yield from (point for point in page.data if key is None or point.key == key)
            if len(page.data) < page_size:
                return
            after = page.last_seq

    def logs(self, run_id: str, *, attempt: int | None = None, after: int = 0) -> LogsPage:
        """One page of an attempt's log from byte ``after`` (default: the newest attempt); follow
        a live run by passing ``next_offset`` back as ``after`` while ``live``. ``ApiError`` 404
        for an unknown run, 422 naming ``attempt`` for one the run did not have."""
        params = {"after": after} | ({"attempt": attempt} if attempt is not None else {})
        return LogsPage.model_validate(self._request("GET", f"{API}/runs/{run_id}/logs", params=params))

    def sweep_logs(self, sweep_id: str, *, attempt: int | None = None, after: int = 0) -> SweepLogsPage:
        """One page of a sweep driver attempt's log (the Tune driver's output and every
        trial's) from byte ``after`` (default: the newest attempt). ``ApiError`` 404 for an
        unknown sweep, 422 naming ``attempt`` for one the sweep did not have."""
        params = {"after": after} | ({"attempt": attempt} if attempt is not None else {})
        return SweepLogsPage.model_validate(self._request("GET", f"{API}/sweeps/{sweep_id}/logs", params=params))

    def wait(self, run_id: str, *, timeout: float = 600.0, poll_interval: float = 0.5,
             on_poll: Callable[[RunView], object] | None = None) -> RunView:
        """Poll until the run reaches a terminal status and return its view; ``on_poll(view)``
        sees every answer (a progress bar), as ``wait_sweep``'s does. ``TimeoutError`` after
        ``timeout`` seconds, saying the run's status (and, while QUEUED, why it waits);
        ``ApiError`` 404 for an unknown run."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_run(run_id)
            if on_poll is not None:
                on_poll(run)
            if run.status.is_terminal:
                return run
            if time.monotonic() > deadline:
                queue = run.queue
                waits = "" if queue is None else (f" (queue position {queue.position}, waiting for {queue.reason}"
                                                  + (f": {queue.detail})" if queue.detail else ")"))
                raise TimeoutError(f"run {run_id} still {run.status.value}{waits} after {timeout:.0f}s")
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
        gets a new ``driver_token``, and the lost answer's stops working).

        Returns the new sweep's view (``skipped``: the algorithm sets refused, and why; ``replayed``
        true for the sweep an earlier request with ``idempotency_key`` made, as ``create_run``).
        ``ApiError`` 422 naming the field for an invalid sweep or base spec (as ``create_run``),
        404 for a ``project`` the key has no role in, 403 for a viewer there; ``InvalidInput``,
        before sending, for ``code`` without a ``base`` mapping."""
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
        answer = self._post_with_retries(f"{API}/sweeps", json=body, params=params, headers=headers)
        return SweepView.model_validate(self._made_here(answer, idempotency_key))

    def get_sweep(self, sweep_id: str) -> SweepView:
        """The sweep's view: status, trials, skipped sets, Pareto front and best run. ``ApiError``
        404 for a sweep that is not in one of your key's projects."""
        return SweepView.model_validate(self._request("GET", f"{API}/sweeps/{sweep_id}"))

    def list_sweeps(self, *, status: SweepStatus | str | None = None, limit: int = 50, cursor: str | None = None,
                    name: str | None = None, archived: bool | str = False, project: str | None = None) -> SweepsPage:
        """Sweeps newest first, with their trials; ``status`` keeps only sweeps in that status
        (any case), ``name`` sweeps whose name contains it (case-insensitive; ``%`` and ``_`` are
        plain characters), ``project`` that project's sweeps (default: every project of the key;
        a project the key has no role in lists none); ``archived``: False (default) hides
        archived sweeps, True shows only them, ``"all"`` both. Pass ``next_cursor`` back as
        ``cursor`` with the same filters. Returns one page (``data``, ``next_cursor``: None on
        the last). ``ApiError`` 422 naming the field for a bad ``cursor``, ``archived`` or
        ``limit`` (1-500); ``ValueError`` for an unknown ``status``, before sending."""
        params: dict[str, Any] = {"limit": limit, "archived": str(archived).lower()}
        if status is not None:
            params["status"] = SweepStatus.of(status).value
        for key, value in (("cursor", cursor), ("name", name), ("project", project)):
            if value is not None:
                params[key] = value
        return SweepsPage.model_validate(self._request("GET", f"{API}/sweeps", params=params))

    def iter_sweeps(self, *, status: SweepStatus | str | None = None, **filters: Any) -> Iterator[SweepView]:
        """Every sweep ``list_sweeps`` would page through with the same filters (a generator: pages
        are fetched as you iterate); raises as ``list_sweeps``."""
        yield from _every_item(self.list_sweeps, status=status, **filters)

    def cancel_sweep(self, sweep_id: str) -> SweepView:
        """Stop the sweep and its trials; returns its view, CANCELING until the driver job is
        stopped (an external sweep is CANCELED at once). ``ApiError`` 409 if it has ended
        already, 404 for an unknown sweep, 403 for a viewer."""
        return SweepView.model_validate(self._request("POST", f"{API}/sweeps/{sweep_id}/cancel"))

    def wait_sweep(self, sweep_id: str, *, timeout: float = 3600.0, poll_interval: float = 1.0,
                   on_poll: Callable[[SweepView], object] | None = None) -> SweepView:
        """Poll until the sweep ends and return its view; ``on_poll(view)`` sees every answer (a
        progress bar). ``TimeoutError`` after ``timeout`` seconds, saying its status;
        ``ApiError`` 404 for an unknown sweep."""
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
        """The driver's word on its sweep (RUNNING, COMPLETED or FAILED), with its sweep
        ``token``; returns the sweep's view. ``ApiError`` 401 for a wrong token, 409 if the
        sweep cannot go to that status, 422 naming ``status`` for another one."""
        return SweepView.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/report/status", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def register_trial(self, sweep_id: str, token: str, registration: TrialRegistration) -> TrialTicket:
        """Create the trial's run (or start its next attempt); returns its run id and run token.
        ``ApiError`` 401 for a wrong sweep token, 409 for a COMPLETED trial, 422 naming the
        field for an invalid ``spec``."""
        return TrialTicket.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/trials", json=registration.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def end_trial(self, sweep_id: str, token: str, trial_id: str, end: TrialEnd) -> RunView:
        """Tell the service that Tune stopped (``stopped``) or lost (``failed``) a trial; returns
        its run's view (a trial that had completed is left as it is). ``ApiError`` 401 for a
        wrong sweep token, 404 for an unknown trial."""
        return RunView.model_validate(self._request(
            "POST", f"{API}/sweeps/{sweep_id}/trials/{trial_id}/end", json=end.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    # --- keys and projects ---------------------------------------------------------------
    def me(self) -> dict[str, Any]:
        """The calling key: ``key_id``, ``roles`` per project, and the ``projects`` it sees.
        ``ApiError`` 401 without a valid key."""
        return self._request("GET", f"{API}/me")

    def create_key(self, project: str, role: str = "member", name: str = "key") -> dict[str, Any]:
        """A new key with ``role`` (viewer, member or admin) in ``project`` (``"*"``: every
        project); the answer's ``key`` is the secret, shown only once. ``ApiError`` 403 unless
        you are admin of ``project`` (of every project for ``"*"``), 404 for a project you have
        no role in, 422 naming ``role`` or ``name`` if invalid."""
        return self._request("POST", f"{API}/keys", json={"project": project, "role": role, "name": name})

    def list_keys(self) -> list[dict[str, Any]]:
        """Your own key and the keys of the projects you administer, as dicts (never their secrets)."""
        return self._request("GET", f"{API}/keys")["data"]

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        """Revoke the key at once (idempotent); returns its record. ``ApiError`` 404 for a key
        that is not yours or of a project you administer, 409 for the last active admin key of
        every project (make another one first)."""
        return self._request("DELETE", f"{API}/keys/{key_id}")

    def create_project(self, name: str) -> dict[str, Any]:
        """A new project (its record). ``ApiError`` 403 unless your key is admin of every
        project, 409 if the name is taken, 422 naming ``name`` if it is not a valid name."""
        return self._request("POST", f"{API}/projects", json={"name": name})

    def list_projects(self) -> list[dict[str, Any]]:
        """The projects your key has a role in, as dicts (name, quotas)."""
        return self._request("GET", f"{API}/projects")["data"]

    def set_quota(self, project: str, **quota: Any) -> dict[str, Any]:
        """Replace ``project``'s quotas (``max_running_runs``, ``max_workers``, ``max_gpus``,
        ``default_max_wall_time_s``, ``max_wall_time_cap_s``, ``max_duration_caps``): one left
        out is no limit. Returns the project's record. ``ApiError`` 403 unless you are its admin
        (a cap that raises the service's needs an admin of every project), 404 for a project you
        have no role in, 422 naming an invalid value."""
        return self._request("PUT", f"{API}/projects/{project}/quota", json=quota)

    def update_quota(self, project: str, **changes: Any) -> dict[str, Any]:
        """Change only the quotas named (the fields of ``set_quota``; None: no limit), keeping
        the rest; returns the project's record. Raises as ``set_quota``."""
        return self._request("PATCH", f"{API}/projects/{project}/quota", json=changes)

    # --- catalog -------------------------------------------------------------------------
    def algorithms(self) -> CatalogPage:
        """Every algorithm (speedup method) with its metadata and params schema."""
        return CatalogPage.model_validate(self._request("GET", f"{API}/algorithms"))

    def models(self) -> CatalogPage:
        """Every model name with its metadata and params schema."""
        return CatalogPage.model_validate(self._request("GET", f"{API}/models"))

    def datasets(self) -> CatalogPage:
        """Every data set name with its metadata and params schema."""
        return CatalogPage.model_validate(self._request("GET", f"{API}/datasets"))

    def health(self) -> dict[str, Any]:
        """``{"status": "ok", "database": "ok", "ray": "ok"|"unreachable"}``. ``ApiError`` 503
        while the service's database is down."""
        return self._request("GET", "/healthz")

    # --- worker reports (per-attempt bearer token) ---------------------------------------
    def report_status(self, run_id: str, token: str, report: StatusReport) -> RunView:
        """A worker's word on its run, with its attempt's run ``token``; returns the run's view.
        ``ApiError`` 401 for a wrong token, 409 for a change the run's status refuses, 422
        naming ``status`` for one a worker may not report."""
        return RunView.model_validate(self._request(
            # Unset fields left out, not sent as null: a service older than a field (its reports
            # forbid unknown ones) still takes a report that does not use it.
            "POST", f"{API}/runs/{run_id}/report/status", json=report.model_dump(mode="json", exclude_none=True),
            headers={"Authorization": f"Bearer {token}"}))

    def report_metrics(self, run_id: str, token: str, report: MetricsReport) -> int:
        """Post a batch of metric points; returns how many the service stored. ``ApiError`` 401
        for a wrong token, 409 once the run has ended, 413 past the points-per-report cap, 422
        past the run's key or point limits or naming an invalid point (``points[i].step``)."""
        body = self._request("POST", f"{API}/runs/{run_id}/report/metrics", json=report.model_dump(mode="json"),
                             headers={"Authorization": f"Bearer {token}"})
        return int(body["stored"])

    def report_note(self, run_id: str, token: str, report: NoteReport) -> RunView:
        """Record a worker's note on its run as a run event; returns the run's view. ``ApiError``
        401 for a wrong token, 409 once the run has ended."""
        return RunView.model_validate(self._request(
            "POST", f"{API}/runs/{run_id}/report/note", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))

    def report_checkpoint(self, run_id: str, token: str, report: CheckpointReport) -> CheckpointView:
        """Tell the service about a committed (or failed) checkpoint; returns its record.
        ``ApiError`` 401 for a wrong token."""
        return CheckpointView.model_validate(self._request(
            "POST", f"{API}/runs/{run_id}/report/checkpoint", json=report.model_dump(mode="json"),
            headers={"Authorization": f"Bearer {token}"}))
