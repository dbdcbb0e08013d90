"""Code packages: upload once (``POST /code?digest=``), then check by digest (``HEAD|GET /code/{digest}``)
and download the zip back (``GET /code/{digest}/package``: what ``workers.export.load_model`` installs).

A run names its package in ``spec.code.digest``; ``POST /runs`` refuses a digest the service
does not have. The body of ``POST`` is the zip itself (``application/zip``), as
``api.code_package.pack_directory`` makes it; the service checks its sha256 and its directory
(paths, links, sizes, a top-level package) and never imports or runs it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from api.code_package import MAX_PACKAGE_BYTES, CodePackageError, CodeView, inspect_package, sha256_hex
from api.model_specs import SHA256_PATTERN
from api.validation_errors import field_error
from service.access import Role
from service.code_store import CodeStore, project_code_store
from service.deps import AccessDep, CallerDep, project_for_create
from service.errors import VALIDATION_RESPONSES, ErrorBody, validation_response
from service.json_body import ParsedBodyRoute

router = APIRouter(prefix="/api/v1/code", tags=["code"], responses=VALIDATION_RESPONSES, route_class=ParsedBodyRoute)

PROJECT_QUERY = Query(max_length=64, description="the project whose packages to use (default: the API key's only "
                                                     "project, else `default`)")
ProjectQuery = Annotated[str | None, PROJECT_QUERY]


def _store(request: Request, caller, access, project: str | None, needed: Role) -> CodeStore:
    """The code store of the caller's project (404 for a project the key has no role in, 403 below ``needed``)."""
    return project_code_store(request, project_for_create(caller, access, project, needed))
Digest = Annotated[str, Path(pattern=SHA256_PATTERN, description="sha256 of the zip, 64 lowercase hex digits")]


@router.post("", status_code=201, response_model=CodeView, operation_id="upload_code",
             responses={200: {"model": CodeView, "description": "already stored (nothing written)"},
                        413: {"model": ErrorBody}},
             openapi_extra={"requestBody": {"required": True,
                                            "content": {"application/zip": {"schema": {"type": "string",
                                                                                       "format": "binary"}}}}})
async def upload_code(request: Request, caller: CallerDep, access: AccessDep,
                      digest: Annotated[str, Query(pattern=SHA256_PATTERN,
                                                   description="the sha256 the client computed")],
                      project: ProjectQuery = None) -> Response:
    """Store a code package (the zip as the body). 201 when stored, 200 when it already was;
    422 if its sha256 differs from ``digest`` or it is not an acceptable package (the message
    says why); 413 above the size cap. Needs a ``member`` role in ``project``."""
    store = _store(request, caller, access, project, Role.MEMBER)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_PACKAGE_BYTES:
            return JSONResponse(status_code=413, content={
                "detail": f"the code package is larger than {MAX_PACKAGE_BYTES} bytes; leave data and checkpoints "
                          "out (.gitignore)"})
        chunks.append(chunk)
    data = b"".join(chunks)
    actual = sha256_hex(data)
    if actual != digest:
        return validation_response([field_error(
            "digest", ["query", "digest"], f"the body's sha256 is {actual}: the upload was changed or cut short, "
            "or the digest was computed over other bytes", digest)])
    try:
        view = inspect_package(data)
    except CodePackageError as exc:
        return validation_response([field_error("body", ["body"], f"not an acceptable code package: {exc}",
                                                None)])
    created = store.put(digest, data)
    view.created = created
    return JSONResponse(status_code=201 if created else 200, content=view.model_dump(mode="json"))


@router.head("/{digest}", operation_id="check_code", responses={404: {"description": "no such package"}})
def check_code(digest: Digest, request: Request, caller: CallerDep, access: AccessDep,
               project: ProjectQuery = None) -> Response:
    """200 if the project stores the package, else 404, without reading it: how clients skip a re-upload."""
    store = _store(request, caller, access, project, Role.VIEWER)
    return Response(status_code=200 if store.exists(digest) else 404)


@router.get("/{digest}", response_model=CodeView, operation_id="get_code", responses={404: {"model": ErrorBody}})
def get_code(digest: Digest, request: Request, caller: CallerDep, access: AccessDep,
             project: ProjectQuery = None) -> Response:
    """The stored package's digest, size, file count and top-level packages; 404 if the project has none."""
    view = _store(request, caller, access, project, Role.VIEWER).describe(digest)
    if view is None:
        return JSONResponse(status_code=404, content={"detail": f"no code package {digest}"})
    return JSONResponse(content=view.model_dump(mode="json"))


@router.get("/{digest}/package", operation_id="download_code",
            responses={200: {"content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
                             "description": "the package's zip, byte for byte as uploaded (its sha256 is digest)"},
                       404: {"model": ErrorBody}})
def download_code(digest: Digest, request: Request, caller: CallerDep, access: AccessDep,
                  project: ProjectQuery = None) -> Response:
    """The stored package's zip, streamed as it was uploaded, to a key with at least a ``viewer``
    role in ``project`` (``load_model`` installs it to rebuild a model trained from it); 404 if
    the project has none. The service only streams the bytes: it never unpacks or imports them."""
    store = _store(request, caller, access, project, Role.VIEWER)
    size = store.size(digest)
    if size is None:
        return JSONResponse(status_code=404, content={"detail": f"no code package {digest}"})
    return StreamingResponse(store.chunks(digest), media_type="application/zip",
                             headers={"Content-Disposition": f'attachment; filename="{digest}.zip"',
                                      "Content-Length": str(size)})
