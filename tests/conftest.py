"""Fixtures shared by the whole suite: a throwaway PostgreSQL database, a Ray head, free ports.

Real components only: PostgreSQL on 127.0.0.1:5432 (trust auth), a Ray head started with
``ray start`` in its own process (so the service can restart around it), moto's HTTP server.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import pytest

# REPO_ROOT and free_port are imported from here by many tests.
from tests.local_ray import REPO_ROOT, RayHead, free_port, ray_process_stacks  # noqa: F401

PG_ADMIN_URL = os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")

# Ray's environment must be set before any Ray process starts: workers inherit it.
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# A worker group restarted after a kill, on a loaded or slow 2-core machine, can take over a minute
# to start (each worker imports torch); a timeout there fails a run that only had to wait.
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "180")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Every service a test starts (in-process or `tessera serve`) makes this its first admin key,
# and every client (SDK, CLI, notebooks) sends it: tests act as the admin of every project.
TEST_ADMIN_KEY = "tsk_test-admin-key-for-the-whole-suite-0123456789"
os.environ["TESSERA_BOOTSTRAP_API_KEY"] = TEST_ADMIN_KEY
os.environ["TESSERA_API_KEY"] = TEST_ADMIN_KEY
ADMIN_HEADERS = {"Authorization": f"Bearer {TEST_ADMIN_KEY}"}
# Services the tests start may read local data under /nonexistent: a test of a missing data set
# must reach the worker (and fail there) rather than be refused at submit.
os.environ.setdefault("TESSERA_DATA_DIRS", "/nonexistent")


@contextlib.contextmanager
def fresh_postgres_database(prefix: str = "tessera_test"):
    """A new, empty PostgreSQL database (its SQLAlchemy URL), dropped when the block ends."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    from sqlalchemy.engine import make_url

    try:  # the same server, user and options as TESSERA_TEST_PG_URL, through SQLAlchemy's psycopg driver
        yield make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg", database=name).render_as_string(
            hide_password=False)
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real MLflow tracking server for the session (starting one takes up to a minute on a
    busy machine); the tests that share it log to experiments of names of their own."""
    from tests.mlflow_server import running_mlflow_server

    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_url():
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    with fresh_postgres_database() as url:
        yield url


class S3Server:
    """moto's S3 over real HTTP on loopback, reachable from Ray workers (in-process mocks are not).

    ``stop()``/``start()`` simulate an outage: moto keeps its buckets across restarts of the
    server in this process, and the port stays the same."""

    def __init__(self, bucket: str = "tessera-test"):
        self.bucket = bucket
        self.port = free_port()
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server for the session, with a bucket. Its address and fake credentials go into
    the environment (``AWS_ENDPOINT_URL``, ...) before any Ray process starts: workers inherit it."""
    server = S3Server()
    server.start()
    os.environ.update(AWS_ENDPOINT_URL=server.endpoint_url, AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    boto3.client("s3", endpoint_url=server.endpoint_url).create_bucket(Bucket=server.bucket)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def ray_head(s3_server):
    """One Ray head (4 logical CPUs even on a 2-core machine: with only as many CPUs as cores, Tune
    trials that start trainers wait for each other's workers and starve) for the session.
    Started after the S3 server, so its workers inherit the S3 environment."""
    head = RayHead(num_cpus=4)
    try:
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="session")
def ray_client(ray_head):
    """``ray.init`` connected to the session's head, for tests that run Ray Train directly."""
    import ray

    ray.init(address=ray_head.address, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed integration test's report carries the stacks of the Ray processes still running
    (a run that timed out shows what it waited on; CI keeps no logs of its own)."""
    report = (yield).get_result()
    if report.when == "call" and report.failed and item.get_closest_marker("integration"):
        try:
            stacks = ray_process_stacks()
        except (Exception, pytest.fail.Exception) as exc:  # pytest-timeout's signal raises the latter
            stacks = f"no stacks: {type(exc).__name__}: {exc}"
        if stacks:
            report.sections.append(("stacks of the Ray processes at the failure (py-spy)", stacks))
