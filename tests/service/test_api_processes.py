"""The API served by several processes on PostgreSQL (``TESSERA_WORKERS``): one process at a
time dispatches (``service.dispatch_lease``), a write answered by another still wakes it, the
lease moves when its holder goes, and ``tessera serve --workers 2`` runs, counts every
process's requests in ``/metrics`` and replaces a process that dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.db.engine import make_engine, migrate
from service.dispatch_lease import LOCK_KEY, AdvisoryLease
from service.settings import Settings
from tests.conftest import ADMIN_HEADERS, fresh_postgres_database
from tests.local_ray import REPO_ROOT, free_port
from tests.service.conftest import FakeJobs

API = "/api/v1"
TESSERA = str(Path(sys.executable).with_name("tessera"))


@pytest.fixture
def empty_database_url():
    """A fresh, empty PostgreSQL database of its own: the dispatch lock is per database, and a
    dispatching service must not see other tests' runs."""
    with fresh_postgres_database("tessera_procs") as url:
        yield url


@pytest.fixture
def database_url(empty_database_url):
    """Like ``empty_database_url``, migrated."""
    engine = make_engine(empty_database_url)
    migrate(engine)
    engine.dispose()
    return empty_database_url


def lock_holders(url: str) -> list[str]:
    """The application names of the sessions that hold the dispatch lock."""
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        return [row[0] for row in conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "  # 1: a one-bigint key
            "AND ((l.classid::bigint << 32) | l.objid::bigint) = %s",
            (LOCK_KEY,))]


def process_apps(tmp_path: Path, database_url: str, jobs: dict, *, interval_s: float):
    """``app_for(name)``: the app of one API process of a 2-process service on ``database_url``,
    with the fake Ray ``jobs[name]``."""
    def app_for(name: str):
        settings = Settings(home=tmp_path / name, database_url=database_url, public_url="http://tessera.test:8000",
                            storage_url=f"file://{tmp_path}/storage", dispatch_interval_s=interval_s, workers=2)
        return create_app(settings, jobs=jobs[name])

    return app_for


def wait_until(condition, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)  # polling a condition, bounded above
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_one_lease_holder_at_a_time_and_the_next_takes_over_when_it_goes(database_url):
    engine = make_engine(database_url)
    first, second = AdvisoryLease(engine), AdvisoryLease(engine)
    try:
        assert first.held() and not second.held()
        assert first.held() and not second.held()  # asking again changes nothing
        assert lock_holders(database_url) == [f"tessera dispatcher pid={os.getpid()}"]
        # The server's side of the session gives a lost client up in seconds, not hours.
        assert first._conn.execute("SHOW tcp_keepalives_idle").fetchone()[0] == "10"
        first.close()  # unlocks before it closes: the next try of another process gets it
        assert second.held()
        assert not first.held()  # the old holder, asking again, finds it taken
    finally:
        first.close()
        second.close()
        engine.dispose()


def test_a_notify_reaches_the_listening_process(database_url):
    engine = make_engine(database_url)
    sender, listener = AdvisoryLease(engine), AdvisoryLease(engine)
    woken = threading.Event()
    try:
        listener.listen(woken.set)
        # LISTEN takes effect once the listening thread has connected: notify until one arrives.
        wait_until(lambda: sender.notify() or woken.wait(0.2), timeout=30, what="a notify to be delivered")
    finally:
        sender.close()
        listener.close()
        engine.dispose()


def test_only_the_lease_holder_dispatches_and_a_follower_passes_its_wakes_on(tmp_path, database_url, example_body):
    """Two API processes' apps on one database: a run submitted to the one that does not
    dispatch goes to Ray at once (a 60 s interval would otherwise hold it), by the one that does;
    when that one stops, the other takes the lease (on its next wake, here) and dispatches."""
    jobs = {"first": FakeJobs(), "second": FakeJobs()}
    app_for = process_apps(tmp_path, database_url, jobs, interval_s=60)

    first = TestClient(app_for("first"), headers=ADMIN_HEADERS).__enter__()
    try:
        with TestClient(app_for("second"), headers=ADMIN_HEADERS) as second:
            assert first.app.state.dispatcher.leading and not second.app.state.dispatcher.leading
            run = second.post(f"{API}/runs", json=example_body).json()
            wait_until(lambda: any(run["id"] in s for s in jobs["first"].submit_calls), timeout=30,
                       what="the leading process to submit the run the other one took")
            assert jobs["second"].submit_calls == []

            first.__exit__(None, None, None)  # the first process goes, and its lease with its connection
            first = None
            later = second.post(f"{API}/runs", json=example_body).json()  # wakes the second, which takes over
            wait_until(lambda: any(later["id"] in s for s in jobs["second"].submit_calls), timeout=30,
                       what="the process left to take the lease and submit the next run")
            assert second.app.state.dispatcher.leading
    finally:
        if first is not None:
            first.__exit__(None, None, None)


class SizedJobs(FakeJobs):
    """A fake Ray whose cluster has ``cpus`` CPUs, and can grow."""

    def __init__(self, cpus: float):
        super().__init__()
        self.cpus = cpus

    def cluster_capacity(self) -> tuple[float, float]:
        return self.cpus, 0.0


def test_a_process_that_does_not_dispatch_still_sees_the_cluster_grow(tmp_path, database_url, example_body,
                                                                      monkeypatch):
    """Its submits are checked against the cluster's size, which only the leader's ticks read:
    the follower reads it on its own, or a run refused on a small cluster would stay refused."""
    from service import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "FOLLOWER_CAPACITY_READ_S", 0.2)
    jobs = {"first": SizedJobs(cpus=1), "second": SizedJobs(cpus=1)}
    app_for = process_apps(tmp_path, database_url, jobs, interval_s=0.1)

    with TestClient(app_for("first"), headers=ADMIN_HEADERS) as first:
        with TestClient(app_for("second"), headers=ADMIN_HEADERS) as second:
            assert not second.app.state.dispatcher.leading
            refused = second.post(f"{API}/runs", json=example_body)  # 2 workers x 1 CPU on a 1-CPU cluster
            assert refused.status_code == 422 and "can never start" in refused.text
            jobs["second"].cpus = jobs["first"].cpus = 8
            wait_until(lambda: second.post(f"{API}/runs", json=example_body).status_code == 201, timeout=30,
                       what="the follower to read the grown cluster")


def test_every_process_says_why_a_queued_run_waits(tmp_path, database_url, example_body, monkeypatch):
    """``queue`` (place and reason) comes from the admission plan, which the leader makes as it
    ticks; a process that does not dispatch plans the queue too, so its answer is the same."""
    from service import dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "FOLLOWER_PLAN_S", 0.2)
    jobs = {"first": SizedJobs(cpus=2), "second": SizedJobs(cpus=2)}  # room for one 2-worker run
    app_for = process_apps(tmp_path, database_url, jobs, interval_s=0.1)

    with TestClient(app_for("first"), headers=ADMIN_HEADERS) as first:
        with TestClient(app_for("second"), headers=ADMIN_HEADERS) as second:
            running = first.post(f"{API}/runs", json=example_body).json()
            wait_until(lambda: first.get(f"{API}/runs/{running['id']}").json()["status"] != "QUEUED", timeout=30,
                       what="the first run to go to Ray")
            waiting = first.post(f"{API}/runs", json=example_body).json()

            def queue_seen_by(client):
                return client.get(f"{API}/runs/{waiting['id']}").json().get("queue")

            seen = wait_until(lambda: queue_seen_by(first), timeout=30, what="the leader's plan")
            assert seen["reason"] == "resources"
            assert wait_until(lambda: queue_seen_by(second), timeout=30, what="the other process's plan") == seen
            assert not second.app.state.dispatcher.leading


def test_serve_with_two_processes_counts_all_requests_and_replaces_a_dead_process(tmp_path, empty_database_url):
    """On an empty database (the supervisor migrates it, once), with no Ray to reach."""
    database_url = empty_database_url
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    scratch = tmp_path / "tmp"  # where the supervisor keeps the processes' Prometheus files
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "TESSERA_HOME": str(tmp_path / "home"),
           "TESSERA_DATABASE_URL": database_url,
           "TESSERA_RAY_ADDRESS": "http://127.0.0.1:9",  # no Ray: the service runs, runs wait
           "TESSERA_RAY_TIMEOUT_S": "1", "TESSERA_DISPATCH_INTERVAL_S": "0.2"}
    log_path = tmp_path / "service.log"
    with open(log_path, "w") as log:
        service = subprocess.Popen([TESSERA, "serve", "--port", str(port), "--workers", "2"], env=env, cwd=REPO_ROOT,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def answers() -> bool:
            assert service.poll() is None, f"the service exited:\n{log_path.read_text()[-3000:]}"
            try:
                return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(answers, timeout=120, what="the service to answer")
        holders = wait_until(lambda: lock_holders(database_url), timeout=30, what="a process to take the lease")
        assert len(holders) == 1
        leader = int(holders[0].rsplit("pid=", 1)[1])
        processes = set(api_processes(service.pid))
        assert leader in processes and len(processes) == 2

        # Both processes serve: fresh connections spread over them (the kernel hashes each), so
        # ask until each has answered one (one may join the port a moment after the other).
        def both_answered() -> bool:
            with httpx.Client(base_url=url, headers=ADMIN_HEADERS) as fresh:
                assert fresh.get(f"{API}/runs").status_code == 200
            return all(requests_counted_by(scratch, pid) > 0 for pid in processes)

        wait_until(both_answered, timeout=60, what="both processes to answer requests")
        # Whichever process answers the scrape counts every process's requests.
        with httpx.Client(base_url=url, headers=ADMIN_HEADERS) as client:
            scraped = client.get("/metrics").text
        counted = sum(float(line.rsplit(" ", 1)[1]) for line in scraped.splitlines()
                      if line.startswith('tessera_http_requests_total{method="GET",route="/api/v1/runs"'))
        assert counted == sum(requests_counted_by(scratch, pid) for pid in processes)

        os.kill(leader, signal.SIGKILL)
        new_holders = wait_until(lambda: [h for h in lock_holders(database_url) if f"pid={leader}" not in h],
                                 timeout=30, what="another process to take the lease")
        assert int(new_holders[0].rsplit("pid=", 1)[1]) in processes
        replaced = wait_until(lambda: len(set(api_processes(service.pid)) - {leader}) == 2 and answers(), timeout=120,
                              what="a new process in place of the killed one")
        assert replaced
    finally:
        service.send_signal(signal.SIGINT)
        try:
            assert service.wait(60) == 0, log_path.read_text()[-3000:]
        finally:
            if service.poll() is None:
                os.killpg(service.pid, signal.SIGKILL)
    assert not lock_holders(database_url)


def requests_counted_by(scratch: Path, pid: int) -> float:
    """``GET /api/v1/runs`` requests counted in process ``pid``'s own Prometheus file."""
    from prometheus_client.mmap_dict import MmapedDict

    total = 0.0
    for path in scratch.glob(f"tessera-metrics-*/counter_{pid}.db"):
        for key, value, _timestamp, _pos in MmapedDict.read_all_values_from_file(str(path)):
            if '"tessera_http_requests_total"' in key and '"/api/v1/runs"' in key and '"GET"' in key:
                total += value
    return total


def api_processes(supervisor: int) -> list[int]:
    """The live API processes under ``supervisor`` (named ``tessera-api`` by multiprocessing's spawn)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == supervisor and fields[0] != "Z" and b"multiprocessing.spawn" in cmdline:
            found.append(int(entry.name))
    return found


def test_serve_with_two_processes_refuses_a_port_another_server_listens_on(tmp_path, empty_database_url):
    """Its processes' SO_REUSEPORT sockets would otherwise share the port with that server."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        env = {**os.environ, "TESSERA_HOME": str(tmp_path / "home"), "TESSERA_DATABASE_URL": empty_database_url,
               "TESSERA_RAY_ADDRESS": "http://127.0.0.1:9"}
        result = subprocess.run([TESSERA, "serve", "--port", str(port), "--workers", "2"], env=env, cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert f"cannot serve on 127.0.0.1:{port}: Address already in use" in result.stderr
