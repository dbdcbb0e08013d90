"""API keys, projects and quotas: ``/keys``, ``/projects``, ``/me`` (see ``service.access``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field

from service.access import EVERY_PROJECT, RAISING_FIELDS, Caller, Forbidden, ProjectNotFound, ProjectRecord, Role
from service.deps import AccessDep, CallerDep
from service.errors import VALIDATION_RESPONSES, ErrorBody
from service.json_body import ParsedBodyRoute

router = APIRouter(prefix="/api/v1", tags=["access"],
                   responses={**VALIDATION_RESPONSES, 401: {"model": ErrorBody}, 403: {"model": ErrorBody}},
                   route_class=ParsedBodyRoute)

PROJECT_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,62}$"
NOT_FOUND = {404: {"model": ErrorBody}}


class KeyCreate(BaseModel):
    project: str = Field(..., pattern=r"^(\*|[a-z0-9][a-z0-9_\-]{0,62})$",
                         description="the project the key acts in; '*': every project (only an admin of every "
                                     "project may make such a key)")
    role: Role = Role.MEMBER
    name: str = Field("key", min_length=1, max_length=128, description="a label to tell keys apart")


class KeyView(BaseModel):
    id: str
    name: str
    prefix: str = Field(description="the key's first characters")
    roles: dict[str, Role]
    created_at: datetime
    revoked_at: datetime | None = None


class NewKey(KeyView):
    key: str = Field(description="the secret: shown only in this answer, stored only as a hash")


class KeysPage(BaseModel):
    data: list[KeyView]


class ProjectCreate(BaseModel):
    name: str = Field(..., pattern=PROJECT_PATTERN, description="lower-case letters, digits, '-' and '_'")


class Quota(BaseModel):
    """A project's limits; null is no limit. A field left out: no limit in a ``PUT``, kept in a
    ``PATCH``."""

    max_running_runs: int | None = Field(None, ge=0, le=100_000, description="runs admitted to Ray at once")
    max_workers: int | None = Field(None, ge=0, le=1_000_000, description="workers of admitted runs, together")
    max_gpus: int | None = Field(None, ge=0, le=1_000_000, description="GPUs of admitted runs, together")
    default_max_wall_time_s: int | None = Field(None, ge=1, le=10 * 365 * 86400,
                                                description="wall-clock limit of runs that set none")
    max_wall_time_cap_s: int | None = Field(None, ge=1, le=10 * 365 * 86400,
                                            description="the longest max_wall_time this project's runs may ask "
                                                        "for (raises the service's cap)")
    max_duration_caps: dict[Literal["ep", "ba", "sp", "tok"], Annotated[int, Field(ge=1, le=2**62)]] | None = Field(
        None, description="the largest max_duration per unit this project's runs may ask for, e.g. "
                          "{\"ep\": 20000} (raises the service's caps; units not given keep them)")


class ProjectView(BaseModel):
    name: str
    created_at: datetime
    quota: Quota
    role: Role | None = Field(None, description="the calling key's role in the project")


class ProjectsPage(BaseModel):
    data: list[ProjectView]


class Me(BaseModel):
    key_id: str
    roles: dict[str, Role] = Field(description="the key's role per project; '*' is every project")
    projects: list[ProjectView] = Field(description="the projects the key may see, with its role in each")


def _project_view(record, caller) -> ProjectView:
    data = record.as_dict()
    return ProjectView(name=data["name"], created_at=data["created_at"], quota=Quota(**data["quota"]),
                       role=caller.role_in(record.name))


@router.get("/me", response_model=Me, operation_id="whoami")
def whoami(caller: CallerDep, access: AccessDep) -> Me:
    """The calling key: its roles, and the projects it sees (the dashboard's project switcher)."""
    return Me(key_id=caller.key_id, roles=caller.roles,
              projects=[_project_view(p, caller) for p in access.list_projects(caller)])


@router.post("/keys", status_code=201, response_model=NewKey, operation_id="create_key", responses=NOT_FOUND)
def create_key(body: KeyCreate, caller: CallerDep, access: AccessDep) -> NewKey:
    """A new key with ``role`` in ``project`` (the caller must be its admin; for ``*``, every
    project, an admin of every project). The secret is in this answer only."""
    if body.project == EVERY_PROJECT and not caller.is_every_project_admin:
        raise Forbidden("only an admin of every project ('*') may create keys for every project")
    caller.require(body.project, Role.ADMIN, ProjectNotFound(body.project))
    record, secret = access.create_key(name=body.name, roles={body.project: body.role})
    return NewKey(**record.as_dict(), key=secret)


@router.get("/keys", response_model=KeysPage, operation_id="list_keys")
def list_keys(caller: CallerDep, access: AccessDep) -> KeysPage:
    """The caller's own key and the keys of the projects it administers (never their secrets)."""
    return KeysPage(data=[KeyView(**k.as_dict()) for k in access.list_keys(caller)])


@router.delete("/keys/{key_id}", response_model=KeyView, operation_id="revoke_key",
                responses={**NOT_FOUND, 409: {"model": ErrorBody}})
def revoke_key(key_id: Annotated[str, Path(max_length=32)], caller: CallerDep, access: AccessDep) -> KeyView:
    """Revoke a key at once (its next request to this service gets 401; to a second service
    process on the same database, within 5 s). Idempotent. The last active admin key of every
    project is not revoked (409): make another one first."""
    return KeyView(**access.revoke_key(caller, key_id).as_dict())


@router.post("/projects", status_code=201, response_model=ProjectView, operation_id="create_project",
             responses={409: {"model": ErrorBody}})
def create_project(body: ProjectCreate, caller: CallerDep, access: AccessDep) -> ProjectView:
    """A new project; only a key that is admin of every project (the first key) may make one."""
    if not caller.is_every_project_admin:
        raise Forbidden("only an admin of every project ('*') may create projects")
    return _project_view(access.create_project(body.name), caller)


@router.get("/projects", response_model=ProjectsPage, operation_id="list_projects")
def list_projects(caller: CallerDep, access: AccessDep) -> ProjectsPage:
    """The projects the key has a role in."""
    return ProjectsPage(data=[_project_view(p, caller) for p in access.list_projects(caller)])


@router.put("/projects/{name}/quota", response_model=ProjectView, operation_id="set_project_quota",
            responses=NOT_FOUND)
def set_quota(name: Annotated[str, Path(max_length=64)], quota: Quota, caller: CallerDep,
              access: AccessDep) -> ProjectView:
    """Replace the project's quotas (admin of the project): a field left out is no limit.
    Changing ``max_wall_time_cap_s`` or ``max_duration_caps`` (which replace bounds the service
    sets for everyone), to another value or to null, needs an admin of every project; a project
    admin sends them back unchanged. ``PATCH`` changes only the fields it is sent."""
    caller.require(name, Role.ADMIN, ProjectNotFound(name))
    changes = quota.model_dump()
    _refuse_raising(changes, access.get_project(name, fresh=True), caller)
    return _project_view(access.set_quota(name, changes), caller)


@router.patch("/projects/{name}/quota", response_model=ProjectView, operation_id="update_project_quota",
              responses=NOT_FOUND)
def update_quota(name: Annotated[str, Path(max_length=64)], quota: Quota, caller: CallerDep,
                 access: AccessDep) -> ProjectView:
    """Change only the quotas in the body (null: no limit); the others are kept, and so are the
    units of ``max_duration_caps`` the body does not name. The same roles as ``PUT``."""
    caller.require(name, Role.ADMIN, ProjectNotFound(name))
    current = access.get_project(name, fresh=True)
    changes = quota.model_dump(include=quota.model_fields_set)
    if changes.get("max_duration_caps"):
        changes["max_duration_caps"] = {**(current.max_duration_caps or {}), **changes["max_duration_caps"]}
    _refuse_raising(changes, current, caller)
    return _project_view(access.set_quota(name, changes, replace=False), caller)


def _refuse_raising(changes: dict, current: ProjectRecord, caller: Caller) -> None:
    """403 for a change of a bound that replaces the service's (``RAISING_FIELDS``, to another
    value or to null) unless the caller administers every project."""
    raising = [field for field in RAISING_FIELDS if field in changes and changes[field] != getattr(current, field)]
    if raising and not caller.is_every_project_admin:
        raise Forbidden(f"only an admin of every project ('*') may set {', '.join(raising)}")
