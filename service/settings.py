"""Service settings from ``TESSERA_*`` environment variables, checked once at startup.

Every setting has an embedded default, so ``tessera serve`` works with none set: a SQLite
file and a storage folder under ``TESSERA_HOME`` and a Ray head started by the service.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

_USERINFO_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:@/]*):(?P<secret>[^@/]*)@")
_SECRET_FIELDS = ("database_url", "storage_url", "ray_address", "public_url")


def redact_url(url: str | None) -> str | None:
    """``scheme://user:secret@host/...`` with the secret replaced by ``***``; other URLs unchanged."""
    if url is None:
        return None
    return _USERINFO_RE.sub(lambda m: f"{m['scheme']}{m['user']}:***@", url)


class Settings(BaseSettings):
    """Where the service keeps its data, which Ray it talks to, and how workers reach it back."""

    model_config = SettingsConfigDict(env_prefix="TESSERA_", extra="ignore", validate_default=True)

    home: Path = Field(Path(".tessera"), description="holds the SQLite file and the local storage folder")
    database_url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///{home}/tessera.db")
    storage_url: str | None = Field(None, description="fsspec URL for checkpoints; default file://{home}/storage")
    ray_address: str | None = Field(
        None, description="Ray dashboard (Jobs API) address such as http://127.0.0.1:8265; "
                          "unset: the service starts an embedded Ray head")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    public_url: str | None = Field(None, description="URL workers use to reach the service; default http://{host}:{port}")
    workers: int = Field(1, ge=1, le=64, description="processes that serve the API (above 1: PostgreSQL only); "
                                                     "one of them at a time dispatches")
    dispatch_interval_s: float = Field(0.5, gt=0.0, le=60.0)
    # --- outages (docs/outages-service.md): nothing waits on Ray or storage without a bound --
    ray_timeout_s: float = Field(10.0, gt=0.0, le=600.0,
                                 description="longest wait for one answer from Ray's Jobs API; "
                                             "longer: Ray counts as unreachable for that call")
    storage_timeout_s: float = Field(60.0, gt=0.0, le=3600.0,
                                     description="longest wait for one storage operation the service makes "
                                                 "(log archive, code store, exports, deletes)")
    ray_submit_retries: int = Field(3, ge=0, le=100,
                                    description="times an attempt whose submit Ray may not have received, "
                                                "and then did not have, is submitted again before the run fails")
    liveness_max_tick_age_s: float = Field(120.0, gt=0.0, le=3600.0,
                                           description="/healthz/live fails when the dispatcher thread has not "
                                                       "finished a tick for this long")
    ray_num_cpus: int | None = Field(None, ge=1, le=4096, description="logical CPUs of the embedded head")
    sweep_driver_restarts: int = Field(2, ge=0, le=100,
                                       description="times a sweep whose driver job died is re-queued before it fails")
    bootstrap_api_key: str | None = Field(
        None, description="the secret of the admin key made on a first start (default: a random one); "
                          "for provisioning and tests, never needed by the embedded default")
    autoscaler: bool = Field(False, description="the Ray cluster can add nodes: a run bigger than the cluster "
                                                "is now is accepted and handed to Ray, whose autoscaler grows the "
                                                "cluster for it (the queue then applies quotas and priorities only)")
    max_wall_time_s: int | None = Field(None, ge=1, le=10 * 365 * 86400,
                                        description="the longest wall-clock time any run may ask for; "
                                                    "an admin raises it per project")
    max_duration_caps: dict[Literal["ep", "ba", "sp", "tok"], Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="the largest max_duration per unit any run may ask for, as JSON ({\"ep\": 20000}); units not "
                    "given keep the defaults (10000ep, 1e8ba, 1e11sp, 1e13tok); an admin raises them per project")
    worker_python: str = Field(default_factory=lambda: sys.executable,
                               description="Python that runs `-m workers.launch` on the Ray nodes")
    # --- limits on input (README "Limits"); each refusal is a 4xx naming the setting -------
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="largest request body; larger: 413")
    code_max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024,
                                     description="largest body under /api/v1/code (code packages); larger: 413")
    max_sweep_trials: int = Field(1000, ge=1, le=1_000_000,
                                  description="trials one sweep may expand to (sets x grid points x num_samples)")
    max_metric_keys_per_run: int = Field(200, ge=1, le=100_000, description="distinct metric keys one run may report")
    max_points_per_report: int = Field(10_000, ge=1, le=10_000, description="metric points in one report")
    max_points_per_run: int = Field(5_000_000, ge=1, description="metric points stored for one run, all attempts")
    data_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="folders local data-set roots may lie under (JSON list or colon-separated); "
                    "the built-in sets' default roots are always allowed")

    @field_validator("database_url", "storage_url", "ray_address", "public_url", "bootstrap_api_key", mode="before")
    @classmethod
    def _blank_means_default(cls, value: Any) -> Any:
        # `TESSERA_RAY_ADDRESS=` in a shell or compose file means "not set", not "empty address".
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("data_dirs", mode="before")
    @classmethod
    def _colon_separated(cls, value: Any) -> Any:
        # TESSERA_DATA_DIRS=/data:/scratch, like PATH (a JSON list works too).
        if isinstance(value, str):
            return [part for part in value.split(":") if part.strip()]
        return value

    @model_validator(mode="after")
    def _fill_defaults_and_check(self) -> "Settings":
        home = self.home.expanduser().resolve()
        self.home = home
        if self.database_url is None:
            self.database_url = f"sqlite:///{home}/tessera.db"
        if self.storage_url is None:
            self.storage_url = f"file://{home}/storage"
        if self.public_url is None:
            self.public_url = f"http://{self.host}:{self.port}"
        if self.ray_num_cpus is None:
            # Ray places by logical CPUs: advertising at least 4 lets two 2-worker runs (or a run and
            # a sweep's trials) share a 2-core machine instead of queueing. (Ray Train's controller
            # holds none in Ray 2.60: num_cpus=0 in ray/train/v2/api/data_parallel_trainer.py.)
            self.ray_num_cpus = max(4, os.cpu_count() or 1)

        scheme = self.database_url.split(":", 1)[0]
        if not (scheme == "sqlite" or scheme.startswith("sqlite+") or scheme.startswith("postgresql")):
            raise ValueError(f"TESSERA_DATABASE_URL must be a sqlite:/// or postgresql+psycopg:// URL; "
                             f"got {redact_url(self.database_url)!r}")
        if scheme.startswith("sqlite") and self.database_url.split("://", 1)[-1] in ("", "/", "/:memory:"):
            raise ValueError("TESSERA_DATABASE_URL: an in-memory SQLite database is private to one connection "
                             "and would lose runs; use a file such as sqlite:////var/lib/tessera/tessera.db")
        if self.workers > 1 and scheme != "postgresql+psycopg":  # the dispatch lease speaks psycopg 3
            raise ValueError(f"TESSERA_WORKERS={self.workers} needs PostgreSQL through psycopg 3 (TESSERA_DATABASE_URL="
                             "postgresql+psycopg://...; the dispatch lease uses it); SQLite takes one writer at a "
                             "time, so its service runs in one process: use TESSERA_WORKERS=1 there")
        if "://" not in self.storage_url:
            raise ValueError(f"TESSERA_STORAGE_URL must be an fsspec URL such as file:///data/tessera or "
                             f"s3://bucket/prefix; got {redact_url(self.storage_url)!r}")
        if self.ray_address is not None and not self.ray_address.startswith(("http://", "https://")):
            raise ValueError(f"TESSERA_RAY_ADDRESS must be the Ray dashboard (Jobs API) HTTP address, such as "
                             f"http://127.0.0.1:8265; got {redact_url(self.ray_address)!r}. "
                             "Leave it unset to start an embedded Ray head.")
        if not self.public_url.startswith(("http://", "https://")):
            raise ValueError(f"TESSERA_PUBLIC_URL must be an http(s) URL that Ray workers can reach; "
                             f"got {redact_url(self.public_url)!r}")
        self.public_url = self.public_url.rstrip("/")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def embedded_ray(self) -> bool:
        """True when the service starts (and owns) its own Ray head."""
        return self.ray_address is None

    @property
    def local_url(self) -> str:
        """Where a client on this machine reaches the service: ``http://{host}:{port}``, with an
        address that listens on every interface read as loopback (``0.0.0.0``: 127.0.0.1, ``::``:
        [::1]) and an IPv6 address in brackets. The credentials file gives it to clients
        (``service.bootstrap``); ``public_url`` is the workers' and may be a name only the cluster
        resolves, or carry credentials."""
        host = self.host
        try:
            address = ipaddress.ip_address(host)
        except ValueError:  # a name
            return f"http://{host}:{self.port}"
        if address.is_unspecified:
            address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
        return f"http://[{address}]:{self.port}" if address.version == 6 else f"http://{address}:{self.port}"

    def redacted(self) -> dict[str, Any]:
        """The settings as plain data with passwords in URLs masked: safe to log."""
        data = self.model_dump(mode="json")
        for name in _SECRET_FIELDS:
            data[name] = redact_url(data[name])
        if data["bootstrap_api_key"] is not None:
            data["bootstrap_api_key"] = "***"
        return data

    def __repr_args__(self):  # pydantic's repr/str: never print a secret by accident
        return list(self.redacted().items())


class SettingsError(ValueError):
    """Invalid settings, one line per problem, naming the environment variable; no secrets."""


def load_settings(**overrides: Any) -> Settings:
    """Read and check the settings; raise ``SettingsError`` with a readable, redacted message.

    pydantic's own message would echo every input value, passwords in URLs included.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_input=False, include_url=False):
            field = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            # Cross-field checks (empty loc) already name their variable.
            lines.append(f"TESSERA_{field.upper()}: {message}" if field else message)
        raise SettingsError("invalid Tessera settings:\n  " + "\n  ".join(lines)) from None
