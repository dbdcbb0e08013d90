"""Who may do what: API keys, their roles per project, and projects with their quotas.

A user's request carries ``Authorization: Bearer tsk_...``. Only the key's sha256 is stored
(``service.tokens``: a key is 32 random bytes, so a plain hash cannot be brute-forced), and a
revoked key stops working at once (in a second service process on the same database, within
``AccessStore.cache_s``). A key holds a role per project:

* ``viewer``: read the project's runs, sweeps, metrics and checkpoints;
* ``member``: also submit, cancel and resume runs, and create and cancel sweeps;
* ``admin``: also create keys for the project and set its quotas.

The project ``*`` stands for every project: the key the service makes on first start holds
``{"*": "admin"}`` and is the only kind that may create projects.

Workers and sweep drivers never use these keys: they report with their attempt's token.
"""

from __future__ import annotations

import enum
import re
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import DEFAULT_PROJECT, ApiKey, Project, utcnow
from service.db.session import Database, clean_text, new_id
from service.tokens import hash_token

KEY_PREFIX = "tsk_"
MAX_KEY_CHARS = 256  # a longer bearer token is refused before it is hashed
EVERY_PROJECT = "*"
PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,62}$")


class Role(str, enum.Enum):
    VIEWER = "viewer"
    MEMBER = "member"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]

    def allows(self, needed: "Role") -> bool:
        return self.rank >= needed.rank


_RANKS = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2}


class Forbidden(PermissionError):
    """The key may see the object but not do this to it (HTTP 403)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(detail)


class ProjectNotFound(LookupError):
    """No such project, or none the key may see (HTTP 404)."""

    def __init__(self, name: str):
        self.detail = f"project {name} not found"
        super().__init__(self.detail)


class KeyNotFound(LookupError):
    """No such key among those the caller may manage (HTTP 404)."""

    def __init__(self, key_id: str):
        self.detail = f"API key {key_id} not found"
        super().__init__(self.detail)


class LastAdminKey(ValueError):
    """Revoking it would leave no active key that is admin of every project (HTTP 409)."""

    def __init__(self, key_id: str):
        self.detail = (f"API key {key_id} is the last active admin key of every project ('*'): without one, no "
                       "project can be created and no cap raised; create another first (tessera keys create "
                       "--project '*' --role admin), then revoke this one")
        super().__init__(self.detail)


class ProjectExists(ValueError):
    """A project of that name exists already (HTTP 409)."""

    def __init__(self, name: str):
        self.detail = f"project {name} already exists"
        super().__init__(self.detail)


@dataclass(frozen=True)
class Caller:
    """The holder of a valid API key: its id, its role in each project (``*``: all) and its name."""

    key_id: str
    roles: dict[str, Role]
    name: str = ""

    @property
    def who(self) -> str:
        """The key as a run's events name who created, canceled or resumed it: ``key 'alice' (k_...)``
        (members of a project may cancel each other's runs; the events say who did)."""
        return f"key {self.name!r} ({self.key_id})" if self.name else f"key {self.key_id}"

    def role_in(self, project: str) -> Role | None:
        own, everywhere = self.roles.get(project), self.roles.get(EVERY_PROJECT)
        found = [role for role in (own, everywhere) if role is not None]
        return max(found, key=lambda role: role.rank) if found else None

    @property
    def sees_every_project(self) -> bool:
        return EVERY_PROJECT in self.roles

    @property
    def is_every_project_admin(self) -> bool:
        """Admin of every project (``*``), as the first key is: may create projects and keys for
        every project, and change the caps a project admin may not."""
        return self.roles.get(EVERY_PROJECT) is Role.ADMIN

    def visible(self, project: str | None = None) -> list[str] | None:
        """The projects whose objects the key may read; None means every project. With
        ``project``: that one alone, or none when the key has no role there (a list filter)."""
        if project is not None:
            return [project] if self.role_in(project) is not None else []
        return None if self.sees_every_project else sorted(self.roles)

    def require(self, project: str, needed: Role, not_found: Exception) -> None:
        """Raise ``not_found`` if the key has no role in ``project`` (so another project's
        objects do not even exist for it), ``Forbidden`` if its role is below ``needed``."""
        role = self.role_in(project)
        if role is None:
            raise not_found
        if not role.allows(needed):
            raise Forbidden(f"this API key is {role.value} in project {project}; "
                            f"this needs {needed.value} or more")

    def default_project(self) -> str:
        """The project a create without ``project`` goes to: the key's only project, else ``default``."""
        named = [name for name in self.roles if name != EVERY_PROJECT]
        return named[0] if len(named) == 1 and not self.sees_every_project else DEFAULT_PROJECT


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    prefix: str
    roles: dict[str, str]
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: ApiKey) -> "KeyRecord":
        return cls(id=row.id, name=row.name, prefix=row.prefix, roles=dict(row.roles or {}),
                   created_at=row.created_at, revoked_at=row.revoked_at)

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "prefix": self.prefix, "roles": self.roles,
                "created_at": self.created_at, "revoked_at": self.revoked_at}


QUOTA_FIELDS = ("max_running_runs", "max_workers", "max_gpus", "default_max_wall_time_s", "max_wall_time_cap_s",
                "max_duration_caps")
# Quota fields that raise a bound the service sets for everyone: only an admin of every project may.
RAISING_FIELDS = ("max_wall_time_cap_s", "max_duration_caps")


@dataclass(frozen=True)
class ProjectRecord:
    name: str
    created_at: datetime
    max_running_runs: int | None = None
    max_workers: int | None = None
    max_gpus: int | None = None
    default_max_wall_time_s: int | None = None
    max_wall_time_cap_s: int | None = None
    max_duration_caps: dict[str, int] | None = None

    @classmethod
    def from_row(cls, row: Project) -> "ProjectRecord":
        return cls(name=row.name, created_at=row.created_at,
                   **{name: getattr(row, name) for name in QUOTA_FIELDS})

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "created_at": self.created_at,
                "quota": {name: getattr(self, name) for name in QUOTA_FIELDS}}


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class AccessStore:
    """API keys and projects over the service's ``Database``.

    Every request authenticates its key and every submit reads its project, so both are
    remembered for ``cache_s`` seconds (each a database session less: three round trips on
    PostgreSQL). A revoke or a quota change through this store forgets what was remembered at
    once; one made by another service process on the same database is seen here within
    ``cache_s``. A key's roles never change after it is created, and projects are never
    renamed or deleted."""

    def __init__(self, db: Database, *, cache_s: float = 5.0, cache_size: int = 10_000):
        self.db = db
        self.cache_s = cache_s
        self.cache_size = cache_size
        self._callers: dict[str, tuple[float, Caller]] = {}  # key hash -> (when read, caller); valid keys only
        self._projects: dict[str, tuple[float, ProjectRecord]] = {}  # name -> (when read, project)
        self._writes = 0  # a read that began before a revoke or quota change is not remembered after it
        self._lock = threading.Lock()  # requests run on a thread pool: check-and-store is one step

    def _remembered(self, cache: dict[str, tuple[float, Any]], name: str) -> Any:
        entry = cache.get(name)
        return entry[1] if entry is not None and time.monotonic() - entry[0] < self.cache_s else None

    def _remember(self, cache: dict[str, tuple[float, Any]], name: str, value: Any, *, read_at: float,
                  writes_then: int) -> None:
        with self._lock:
            if writes_then != self._writes:
                return
            if len(cache) >= self.cache_size:
                cache.clear()
            cache[name] = (read_at, value)

    def _forget(self) -> None:
        """After a committed revoke or quota change: nothing read before it is used again."""
        with self._lock:
            self._writes += 1
            self._callers.clear()
            self._projects.clear()

    # --- keys ----------------------------------------------------------------------------
    def authenticate(self, secret: str) -> Caller | None:
        """The caller holding ``secret``, or None for an unknown or revoked key."""
        if not secret.startswith(KEY_PREFIX) or len(secret) > MAX_KEY_CHARS:
            return None
        digest = hash_token(secret)
        caller = self._remembered(self._callers, digest)
        if caller is not None:
            return caller
        read_at, writes_then = time.monotonic(), self._writes
        with self.db.read() as session:
            row = session.execute(select(ApiKey).where(ApiKey.key_hash == digest)).scalar_one_or_none()
            if row is None or row.revoked_at is not None:
                return None
            caller = Caller(key_id=row.id, roles={project: Role(role) for project, role in (row.roles or {}).items()},
                            name=row.name or "")
        self._remember(self._callers, digest, caller, read_at=read_at, writes_then=writes_then)
        return caller

    def remembered_caller(self, secret: str) -> Caller | None:
        """The caller holding ``secret`` if a read of the last ``cache_s`` found its key valid
        (no database read); None otherwise, including for keys that may well be valid."""
        return self._remembered(self._callers, hash_token(secret)) if len(secret) <= MAX_KEY_CHARS else None

    def has_keys(self) -> bool:
        with self.db.read() as session:
            return session.execute(select(ApiKey.id).limit(1)).first() is not None

    def create_key(self, *, name: str, roles: dict[str, Role], secret: str | None = None) -> tuple[KeyRecord, str]:
        """Store a new key with ``roles``; returns it and its secret (shown once, never stored)."""
        secret = secret or new_api_key()
        with self.db.write() as session:
            for project in roles:
                if project != EVERY_PROJECT:
                    _require_project(session, project)
            row = ApiKey(id=new_id(), name=clean_text(name) or "key", key_hash=hash_token(secret),
                         prefix=secret[:len(KEY_PREFIX) + 4], roles={p: r.value for p, r in roles.items()},
                         created_at=utcnow())
            session.add(row)
            session.flush()
            return KeyRecord.from_row(row), secret

    def list_keys(self, caller: Caller) -> list[KeyRecord]:
        """Keys the caller administers: every key for ``*`` admins, else the keys whose every
        project is one the caller is admin of (and always the caller's own key)."""
        with self.db.read() as session:
            rows = session.execute(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)).scalars()
            return [KeyRecord.from_row(row) for row in rows if row.id == caller.key_id or _administers(caller, row)]

    def revoke_key(self, caller: Caller, key_id: str) -> KeyRecord:
        with self.db.write() as session:
            row = session.get(ApiKey, key_id) if 0 < len(key_id) <= 32 else None
            if row is None or not (row.id == caller.key_id or _administers(caller, row)):
                raise KeyNotFound(key_id)
            if row.revoked_at is None and _is_every_project_admin(row):
                # Every active key, locked in one order: two revokes of the last two admin keys at
                # once must not both see the other still active. On PostgreSQL the second waits
                # here, then reads the first's revoke (its WHERE is checked again after the wait);
                # SQLite runs one write transaction at a time anyway.
                active = select(ApiKey).where(ApiKey.revoked_at.is_(None)).order_by(ApiKey.id).with_for_update()
                admins = [key.id for key in session.execute(active).scalars() if _is_every_project_admin(key)]
                if admins == [row.id]:
                    raise LastAdminKey(key_id)
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            session.flush()
            record = KeyRecord.from_row(row)
        self._forget()
        return record

    # --- projects ------------------------------------------------------------------------
    def create_project(self, name: str) -> ProjectRecord:
        with self.db.write() as session:
            if session.get(Project, name) is not None:
                raise ProjectExists(name)
            row = Project(name=name, created_at=utcnow())
            session.add(row)
            session.flush()
            return ProjectRecord.from_row(row)

    def list_projects(self, caller: Caller | None = None) -> list[ProjectRecord]:
        """Every project (``caller`` None), or those ``caller`` has a role in."""
        with self.db.read() as session:
            rows = session.execute(select(Project).order_by(Project.name)).scalars()
            return [ProjectRecord.from_row(row) for row in rows
                    if caller is None or caller.role_in(row.name) is not None]

    def get_project(self, name: str, *, fresh: bool = False) -> ProjectRecord:
        """The project ``name`` (``ProjectNotFound`` if none); ``fresh``: read now, not remembered
        (a check that decides a write, such as who may raise a quota)."""
        project = None if fresh else self._remembered(self._projects, name)
        if project is not None:
            return project
        read_at, writes_then = time.monotonic(), self._writes
        with self.db.read() as session:
            project = ProjectRecord.from_row(_require_project(session, name))
        self._remember(self._projects, name, project, read_at=read_at, writes_then=writes_then)
        return project

    def set_quota(self, name: str, quota: dict[str, Any], *, replace: bool = True) -> ProjectRecord:
        """Replace the project's quotas with ``quota`` (missing fields: no limit); with
        ``replace=False``, change only the fields ``quota`` holds (None: no limit)."""
        with self.db.write() as session:
            row = _require_project(session, name)
            for field in QUOTA_FIELDS:
                if replace or field in quota:
                    setattr(row, field, quota.get(field))
            session.flush()
            record = ProjectRecord.from_row(row)
        self._forget()
        return record


def _require_project(session: Session, name: str) -> Project:
    row = session.get(Project, name) if PROJECT_NAME.match(name or "") else None
    if row is None:
        raise ProjectNotFound(name)
    return row


def _is_every_project_admin(row: ApiKey) -> bool:
    return (row.roles or {}).get(EVERY_PROJECT) == Role.ADMIN.value


def _administers(caller: Caller, row: ApiKey) -> bool:
    roles = row.roles or {}
    if caller.is_every_project_admin:
        return True
    return bool(roles) and EVERY_PROJECT not in roles and all(
        (caller.role_in(project) or Role.VIEWER).allows(Role.ADMIN) for project in roles)
