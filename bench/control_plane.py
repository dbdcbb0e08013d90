"""Control-plane benchmark: the service on PostgreSQL under a bounded, loopback-only load.

    PYTHONPATH=. .venv/bin/python bench/control_plane.py [--quick] [--sizes 1000,10000,100000] \
        [--metric-points 10000000] [--pg postgresql://postgres@127.0.0.1:5432/test] \
        [--ticks 30] [--workers N] [--out docs/bench/control-plane-DATE.json] [--py-spy FILE]

Makes a throwaway database (``bench.seed.scratch_database``), seeds 1,000 RUNNING runs that the
dispatcher follows, then for each size in ``--sizes`` tops the ended runs up to that count
(batched INSERTs; ``--metric-points`` points by COPY before the largest size) and measures,
against a real uvicorn server in its own process (``bench/control_plane_server.py``: the real
app with its dispatcher thread, Ray replaced by ``ListingRay``, which accepts every submit):

- ``submit``: ``POST /runs`` with 16 concurrent clients, and how long the dispatcher took to
  hand every one of them to (fake) Ray;
- ``get_run`` / ``list_runs``: ``GET /runs/{id}`` (random stored run) and ``GET /runs?limit=50``
  latency, one client (the goal's figure) and 16 concurrent clients;
- ``ingest``: points/s through ``POST /runs/{id}/report/metrics`` from 8 concurrent runs, each
  authenticated with the token its submitted job got (batches of ``--points-per-report``);
- ``dashboard``: 50 open pages polling back to back as ``service/dashboard/static/js`` does
  (40 run pages: conditional GET of the run, new metrics by cursor, logs, and every 5th poll its
  events, checkpoints, exports and children; 10 run lists: conditional ``GET /runs?limit=100``);
- ``sweep``: a 200-trial sweep expanded (every trial registered, RUNNING and COMPLETED, 8 at a
  time, as its driver does) while one client reads ``GET /runs/{id}``; that p99 over ``get_run``'s;
- ``tick``: ``Dispatcher.tick()`` in this process, with the 1,000 active runs and the log
  archiver on its own thread (as in the service), timed by ``tick_listeners`` (wall) and
  ``time.thread_time`` (``cpu``: the tick's thread only); the Ray calls the ticks made, by method
  (one ``states`` list), and those the archiver's passes made (``job_logs``: the live logs it
  copied, at most ``copies_per_tick`` a pass).

Every request counts, and the load stops by itself: each phase sends a fixed number of requests.
Client and server share this machine's cores; ``client_cpu_s`` and ``server_cpu_s`` say how much
each used. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import date, datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.local_ray import free_port  # noqa: E402
from bench.seed import (copy_metrics, fill, fill_active, percentiles, scratch_database,  # noqa: E402
                        vacuum_analyze)

REPO_ROOT = Path(__file__).resolve().parent.parent
API = "/api/v1"
BENCH_KEY = "tsk_bench-control-plane-0123456789abcdef0123456"
GOALS = {"submits_per_s": 500.0, "get_run_p99_ms": 20.0, "list_runs_p99_ms": 20.0,
         "ingest_points_per_s": 50_000.0, "tick_p99_ms": 50.0,
         # not in issue 14: 50 pages each polling at the dashboard's 3 s interval (app.js POLL_MS)
         "dashboard_polls_per_s": 50 / 3.0}
LOWER_IS_BETTER = {"get_run_p99_ms", "list_runs_p99_ms", "tick_p99_ms"}
RUN_BODY = {
    "name": "bench-submit", "model": {"name": "cifar_resnet20"},
    "data": {"train": {"name": "digits", "split": "train"}, "eval": {"name": "digits", "split": "test"},
             "batch_size": 64},
    "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}, "max_duration": "3ep", "eval_interval": "1ep",
    "parallelism": {"strategy": "ddp", "num_workers": 2}, "seed": 42,
}

FULL = {"sizes": [1_000, 10_000, 100_000], "active": 1_000, "metric_points": 10_000_000, "metric_runs": 1_000,
        "submits": 1_000, "gets": 300, "ingest_reports": 20, "points_per_report": 1_000,
        "pages": 50, "polls": 5, "ticks": 30, "sweep_trials": 200}
QUICK = {"sizes": [200], "active": 20, "metric_points": 2_000, "metric_runs": 10,
         "submits": 32, "gets": 20, "ingest_reports": 2, "points_per_report": 100,
         "pages": 10, "polls": 2, "ticks": 5, "sweep_trials": 12}


class Tally:
    """Latencies and failures of one phase's requests."""

    def __init__(self):
        self.samples: list[float] = []
        self.failures: list[str] = []
        self.requests = 0

    def check(self, response, began: float, ok: tuple[int, ...]) -> bool:
        self.samples.append(time.perf_counter() - began)
        self.requests += 1
        if response.status_code not in ok:
            self.failures.append(f"{response.request.method} {response.request.url.path}: "
                                 f"{response.status_code} {response.text[:200]}")
            return False
        return True

    def report(self, wall_s: float) -> dict:
        return {**percentiles(self.samples or [0.0]), "requests": self.requests, "failed": len(self.failures),
                "per_s": round(self.requests / wall_s, 1) if wall_s else None, "wall_s": round(wall_s, 2),
                **({"first_failures": self.failures[:3]} if self.failures else {})}


class NoAnswer:
    """Stands in for the response of a request that got none (connection reset, timeout)."""

    status_code = 0
    headers: dict = {}
    text = ""

    def __init__(self, error: Exception):
        self.error = error

    def json(self) -> dict:
        return {}


async def request(client, tally: Tally, method: str, url: str, ok=(200,), **kwargs):
    """One request, counted in ``tally``; a transport error counts as a failure, not a crash."""
    import httpx

    began = time.perf_counter()
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.TransportError as exc:
        tally.samples.append(time.perf_counter() - began)
        tally.requests += 1
        tally.failures.append(f"{method} {url}: no answer ({type(exc).__name__}: {exc})")
        return NoAnswer(exc)
    tally.check(response, began, ok)
    return response


async def spread(concurrency: int, count: int, one) -> float:
    """Run ``one(i)`` for i in 0..count-1 on ``concurrency`` workers; return the wall time (s)."""
    indexes = iter(range(count))

    async def worker():
        for i in indexes:
            await one(i)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began


# --- phases ------------------------------------------------------------------------------

async def submit_phase(client, count: int, clients: int = 16) -> tuple[dict, list[str]]:
    """``count`` ``POST /runs`` from ``clients`` concurrent connections of the lean client (``bench.http_load``:
    httpx would spend as much CPU as the service on this machine), then the time until the
    dispatcher handed every one to Ray."""
    from bench.http_load import LeanConnection

    tally, ids = Tally(), []
    headers = {"Authorization": client.headers["Authorization"]}
    connections = [LeanConnection(client.base_url.host, client.base_url.port, headers) for _ in range(clients)]
    free = list(connections)

    async def one(i):
        connection = free.pop()
        began = time.perf_counter()
        try:
            status, body = await connection.request("POST", f"{API}/runs", {**RUN_BODY, "name": f"bench-submit-{i}"})
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            status, body = 0, f"no answer ({type(exc).__name__}: {exc})".encode()
        finally:
            free.append(connection)
        tally.samples.append(time.perf_counter() - began)
        tally.requests += 1
        if status == 201:
            ids.append(json.loads(body)["id"])
        else:
            tally.failures.append(f"POST {API}/runs: {status} {body[:200].decode(errors='replace')}")

    wall = await spread(clients, count, one)
    for connection in connections:
        await connection.close()
    result = tally.report(wall)
    # The dispatcher wakes on each submit; the queue is drained when no run is QUEUED.
    began = time.perf_counter()
    while (await client.get(f"{API}/runs", params={"status": "QUEUED", "limit": 1})).json()["data"]:
        if time.perf_counter() - began > 300:
            result["drain_error"] = "runs still QUEUED after 300 s"
            break
        await asyncio.sleep(0.05)  # polling a condition, bounded above
    result["all_submitted_to_ray_after_s"] = round(wall + time.perf_counter() - began, 2)
    return result, ids


async def tokens_of(jobs_log: Path, run_ids: list[str], timeout_s: float = 60) -> dict[str, str]:
    """Each run's attempt-1 token, from the env of the job the dispatcher submitted (as tests do).
    A run turns STARTING just before its job is sent: wait (bounded) for every job's line."""
    wanted = {f"run-{run_id}-attempt-1": run_id for run_id in run_ids}
    deadline = time.monotonic() + timeout_s
    while True:
        tokens = {}
        for line in jobs_log.read_text().splitlines():
            job = json.loads(line)
            if job["job"] in wanted:
                tokens[wanted[job["job"]]] = job["token"]
        if len(tokens) == len(wanted) or time.monotonic() > deadline:
            return tokens
        await asyncio.sleep(0.05)  # polling a condition, bounded above


async def ingest_phase(client, tokens: dict[str, str], reports: int, per_report: int) -> dict:
    tally = Tally()
    stored = 0
    now = datetime.now(timezone.utc).isoformat()
    for run_id, token in tokens.items():
        await request(client, tally, "POST", f"{API}/runs/{run_id}/report/status", json={"status": "RUNNING"},
                      headers={"Authorization": f"Bearer {token}"})
    keys = [f"train/k{k}" for k in range(10)]

    async def run_worker(run_id: str, token: str):
        nonlocal stored
        session = uuid.uuid4().hex
        for batch in range(reports):
            first = batch * per_report // len(keys)
            points = [{"step": first + i // len(keys), "key": keys[i % len(keys)], "value": 1.0 / (i + 1),
                       "time": now} for i in range(per_report)]
            response = await request(client, tally, "POST", f"{API}/runs/{run_id}/report/metrics",
                                     json={"points": points, "session": session, "batch": batch + 1},
                                     headers={"Authorization": f"Bearer {token}"})
            if response.status_code == 200:
                stored += response.json()["stored"]

    tally.samples.clear()
    began = time.perf_counter()
    await asyncio.gather(*(run_worker(run_id, token) for run_id, token in tokens.items()))
    wall = time.perf_counter() - began
    return {**tally.report(wall), "runs": len(tokens), "points_per_report": per_report,
            "points_stored": stored, "points_per_s": round(stored / wall, 1)}


async def sweep_phase(client, trials: int, reads_path, rng: random.Random) -> dict:
    """A sweep of ``trials`` grid points expanded while one client reads ``GET /runs/{id}``:
    the driver (``driver=external``: Ray is faked, so the bench plays the Tune driver a
    service sweep's Ray job runs, through the same routes and token) registers every trial, 8
    at a time as Tune starts them, reports each RUNNING and ends it; the reader's latencies are
    ``during``, against ``get_run`` measured alone in the same run."""
    lrs = [round(0.001 * (i + 1), 6) for i in range(trials)]
    body = {"name": "bench-sweep", "base": {**RUN_BODY, "name": "bench-trial"},
            "search": {"params": {"optimizer.lr": {"grid": lrs}}}}
    created = await client.post(f"{API}/sweeps", json=body, params={"driver": "external"})
    created.raise_for_status()
    sweep_id, driver = created.json()["id"], {"Authorization": f"Bearer {created.json()['driver_token']}"}
    driving, reading = Tally(), Tally()
    done = asyncio.Event()

    async def trial(i: int):
        spec = {**RUN_BODY, "name": f"bench-trial-{i}", "optimizer": {**RUN_BODY["optimizer"], "lr": lrs[i]}}
        ticket = await request(client, driving, "POST", f"{API}/sweeps/{sweep_id}/trials", headers=driver, json={
            "trial_id": f"t{i:04d}", "spec": spec, "params": {"optimizer.lr": lrs[i]}})
        if ticket.status_code != 200:
            return
        run_token = {"Authorization": f"Bearer {ticket.json()['token']}"}
        run_id = ticket.json()["run_id"]
        await request(client, driving, "POST", f"{API}/runs/{run_id}/report/status", json={"status": "RUNNING"},
                      headers=run_token)
        await request(client, driving, "POST", f"{API}/runs/{run_id}/report/status", json={"status": "COMPLETED"},
                      headers=run_token)

    async def driver_loop():
        try:
            await spread(8, trials, trial)
        finally:
            done.set()

    async def reader():
        while not done.is_set():
            await request(client, reading, "GET", reads_path(rng))

    began = time.perf_counter()
    await asyncio.gather(driver_loop(), reader())
    wall = time.perf_counter() - began
    view = (await client.get(f"{API}/sweeps/{sweep_id}")).json()
    return {"trials": trials, "trials_completed": view.get("counts", {}).get("COMPLETED", 0),
            "driver": driving.report(wall), "get_run_during": reading.report(wall)}


async def read_phase(client, path_of, count: int, concurrency: int, rng: random.Random) -> dict:
    tally = Tally()
    await client.get(path_of(rng))  # warm

    async def one(_):
        await request(client, tally, "GET", path_of(rng))

    return tally.report(await spread(concurrency, count, one))


async def dashboard_phase(client, run_ids: list[str], pages: int, polls: int, rng: random.Random) -> dict:
    """``pages`` open pages (4 in 5 a run page, the rest the run list) polling back to back."""
    tally, first_polls, later_polls = Tally(), [], []
    ok = (200, 304)

    async def conditional(url: str, etags: dict):
        headers = {"If-None-Match": etags[url]} if url in etags else {}
        response = await request(client, tally, "GET", url, ok=ok, headers=headers)
        if "ETag" in response.headers:
            etags[url] = response.headers["ETag"]
        return response

    async def run_page(run_id: str):
        path, etags, cursor, log_offset, log_done, run = f"{API}/runs/{run_id}", {}, 0, 0, False, None
        for poll in range(polls):
            began = time.perf_counter()
            answer = await conditional(path, etags)
            if answer.status_code == 200:
                run = answer.json()
            if poll % 5 == 0:  # run.js EVENTS_EVERY (and the first poll)
                for tail in ("/events", "/checkpoints", "/exports", "/children"):
                    await request(client, tally, "GET", path + tail)
            for _ in range(10):  # run.js MAX_PAGES_PER_POLL of METRICS_PAGE points
                page = (await request(client, tally, "GET", f"{path}/metrics",
                                      params={"after": cursor, "limit": 10_000})).json()
                cursor = page.get("last_seq", cursor)
                if len(page.get("data", [])) < 10_000:
                    break
            for _ in range(4 if not log_done and run else 0):  # logs.js MAX_PAGES_PER_POLL
                logs = (await request(client, tally, "GET", f"{path}/logs",
                                      params={"attempt": run["attempt"], "after": log_offset})).json()
                log_offset = logs.get("next_offset", log_offset)
                if log_offset >= logs.get("size", 0):
                    log_done = not logs.get("live", False)
                    break
            (first_polls if poll == 0 else later_polls).append(time.perf_counter() - began)

    async def list_page():
        etags = {}
        for poll in range(polls):
            began = time.perf_counter()
            await conditional(f"{API}/runs?limit=100", etags)
            (first_polls if poll == 0 else later_polls).append(time.perf_counter() - began)

    began = time.perf_counter()
    run_pages = pages * 4 // 5
    await asyncio.gather(*(run_page(rng.choice(run_ids)) for _ in range(run_pages)),
                         *(list_page() for _ in range(pages - run_pages)))
    wall = time.perf_counter() - began
    return {"pages": pages, "run_pages": run_pages, "polls_per_page": polls,
            "polls_per_s": round(pages * polls / wall, 1), "first_poll": percentiles(first_polls),
            "later_polls": percentiles(later_polls or [0.0]), "requests": tally.report(wall)}


def tick_phase(url: str, active: list[str], ticks: int) -> dict:
    """``Dispatcher.tick()`` over the active runs, in this process, against a listing fake Ray."""
    from bench.control_plane_server import ListingRay, active_job_ids
    from service.db.engine import make_engine
    from service.dispatcher import Dispatcher
    from service.heap import startup_heap_frozen
    from service.repository import Repository
    from service.settings import Settings

    class CountingRay(ListingRay):
        """Counts the Jobs API calls a tick makes, by method."""

        def __init__(self, job_ids: list[str]):
            self.calls: dict[str, int] = {}  # before the first call is counted
            super().__init__(job_ids)

        def __getattribute__(self, name):
            if name in ("submit", "status", "states", "stop", "logs_tail", "job_logs", "delete", "cluster_capacity"):
                calls = object.__getattribute__(self, "calls")
                key = (threading.current_thread().name == "tessera-log-archiver", name)
                calls[key] = calls.get(key, 0) + 1
            return object.__getattribute__(self, name)

    engine = make_engine(url)
    durations: list[float] = []
    cpu: list[float] = []  # the tick's own CPU: steadier than wall time on a busy machine
    try:
        with tempfile.TemporaryDirectory() as home:
            settings = Settings(home=Path(home), database_url=url, storage_url=f"file://{home}/storage")
            ray = CountingRay(active_job_ids(len(active)))
            dispatcher = Dispatcher(Repository(engine), ray, settings)
            archiver = dispatcher.log_archiver
            dispatcher.tick()  # warm: the first tick loads the modules and fills the pool
            ray.calls, passes_before = {}, archiver.passes
            dispatcher.tick_listeners.append(durations.append)
            archiver.start()  # as Dispatcher.start does in the service
            try:
                with startup_heap_frozen():  # as the service's lifespan does once it has started
                    for _ in range(ticks):
                        began = time.thread_time()
                        dispatcher.tick()
                        cpu.append(time.thread_time() - began)
            finally:
                archiver.stop()  # after its last pass: every copy below is counted
            passes = archiver.passes - passes_before
    finally:
        engine.dispose()
    on_tick = {name: count for (by_archiver, name), count in ray.calls.items() if not by_archiver}
    by_archiver = {name: count for (by_archiver, name), count in ray.calls.items() if by_archiver}
    return {**percentiles(durations), "active_runs": len(active),
            # states: the one job list a tick
            "ray_calls_per_tick": round(sum(on_tick.values()) / ticks, 2),
            "ray_calls_per_tick_by_method": {name: round(count / ticks, 2) for name, count in sorted(on_tick.items())},
            # job_logs: live logs copied; fewer passes than ticks when a pass outlasted a tick
            "archiver": {"passes": passes, "ray_calls_by_method": dict(sorted(by_archiver.items()))},
            "cpu": percentiles(cpu), "ray_error": dispatcher.ray_error}


# --- the run --------------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every live process under it (a server's workers)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    tree = {pid}
    for _ in range(8):  # deep enough for a supervisor's workers and their helpers
        tree |= {child for child, (parent, _) in stats.items() if parent in tree}
    ticks = sum(stats[member][1] for member in tree if member in stats)
    return ticks / os.sysconf("SC_CLK_TCK")


def run_count(engine) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM runs")).scalar_one()


def settle(engine, run_ids: list[str]) -> None:
    """End the runs a phase submitted (as if they completed), so the next size does not follow them."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET status = 'COMPLETED', token_hash = NULL, finished_at = now() "
                          "WHERE id = ANY(:ids)"), {"ids": run_ids})


async def measure_size(base: str, jobs_log: Path, server_pid: int, sizes: dict, metric_run_ids: list[str],
                       stored_ids: list[str], engine, seed: int) -> dict:
    import httpx

    rng = random.Random(seed)
    result: dict = {"runs_stored": run_count(engine)}
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {BENCH_KEY}"}, limits=limits,
                                 timeout=120) as client:
        async def phase(name, make):
            cpu, server_cpu = time.process_time(), cpu_seconds(server_pid)
            value = await make
            value["client_cpu_s"] = round(time.process_time() - cpu, 2)
            value["server_cpu_s"] = round(cpu_seconds(server_pid) - server_cpu, 2)
            result[name] = value
            return value

        submitted = []

        async def submits():
            value, ids = await submit_phase(client, sizes["submits"])
            submitted.extend(ids)
            return value

        await phase("submit", submits())
        ingest_runs = submitted[:8]
        await phase("ingest", ingest_phase(client, await tokens_of(jobs_log, ingest_runs), sizes["ingest_reports"],
                                           sizes["points_per_report"]))
        settle(engine, submitted)
        await phase("get_run", read_phase(client, lambda r: f"{API}/runs/{r.choice(stored_ids)}",
                                          sizes["gets"], 1, rng))
        await phase("list_runs", read_phase(client, lambda r: f"{API}/runs?limit=50", sizes["gets"], 1, rng))
        await phase("get_run_16_clients", read_phase(client, lambda r: f"{API}/runs/{r.choice(stored_ids)}",
                                                     sizes["gets"] * 2, 16, rng))
        await phase("list_runs_16_clients", read_phase(client, lambda r: f"{API}/runs?limit=50",
                                                       sizes["gets"] * 2, 16, rng))
        await phase("dashboard", dashboard_phase(client, ingest_runs + metric_run_ids, sizes["pages"],
                                                 sizes["polls"], rng))
        sweep = await phase("sweep", sweep_phase(client, sizes["sweep_trials"],
                                                 lambda r: f"{API}/runs/{r.choice(stored_ids)}", rng))
        alone = result["get_run"]["p99_ms"]
        sweep["get_run_p99_during_over_alone"] = round(sweep["get_run_during"]["p99_ms"] / alone, 2) if alone else None
    return result


def wait_until_up(base: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} before answering")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)  # not listening yet: ask again, bounded by the deadline
    raise SystemExit(f"the server did not answer /healthz within {timeout_s} s")


def ratios(result: dict, largest: dict) -> dict:
    """Each goal, the figure measured against it (at the largest size) and measured/goal
    (goal/measured for latencies, so > 1 always means the goal is met)."""
    measured = {"submits_per_s": largest["submit"]["per_s"], "get_run_p99_ms": largest["get_run"]["p99_ms"],
                "list_runs_p99_ms": largest["list_runs"]["p99_ms"],
                "ingest_points_per_s": largest["ingest"]["points_per_s"], "tick_p99_ms": result["tick"]["p99_ms"],
                "dashboard_polls_per_s": largest["dashboard"]["polls_per_s"]}
    out = {}
    for name, goal in GOALS.items():
        value = measured[name]
        ratio = goal / value if name in LOWER_IS_BETTER else value / goal
        out[name] = {"measured": value, "goal": goal, "ratio": round(ratio, 3) if value else None,
                     "direction": "at most" if name in LOWER_IS_BETTER else "at least", "met": ratio >= 1}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke-test size (seconds, not minutes)")
    parser.add_argument("--sizes", default=None, help="ended runs stored, comma-separated (default 1000,10000,100000)")
    parser.add_argument("--metric-points", type=int, default=None, help="points COPYed before the largest size")
    parser.add_argument("--points-per-report", type=int, default=None)
    parser.add_argument("--ticks", type=int, default=None,
                        help=f"dispatcher ticks timed (default {FULL['ticks']}; with 30 the p99 is the slowest tick)")
    parser.add_argument("--pg", default=os.environ.get("TESSERA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--workers", type=int, default=1, help="API processes of the server (TESSERA_WORKERS)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--py-spy", type=Path, default=None,
                        help="record the server with py-spy into this file (collapsed stacks of the thread "
                             "holding the GIL: where the server's Python CPU goes)")
    args = parser.parse_args()
    sizes = dict(QUICK if args.quick else FULL)
    if args.sizes:
        sizes["sizes"] = [int(s) for s in args.sizes.split(",")]
    for name in ("metric_points", "points_per_report", "ticks"):  # the sizes a flag may override
        if getattr(args, name) is not None:
            sizes[name] = getattr(args, name)

    from service.db.engine import make_engine

    report: dict = {"bench": "control_plane", "date": date.today().isoformat(), "quick": args.quick,
                    "commit": short_commit(REPO_ROOT),
                    "machine": f"{os.cpu_count()} cores, client and server on the same machine (loopback)",
                    "ray": "faked in the server process (bench/control_plane_server.py ListingRay): every submit "
                           "accepted at once, every job listed by one states() call",
                    "settings": {**sizes, "workers": args.workers}, "sizes": {}, "seeding": {}}
    with scratch_database(args.pg) as url, tempfile.TemporaryDirectory() as scratch:
        engine = make_engine(url)
        port, jobs_log = free_port(), Path(scratch) / "jobs.jsonl"
        jobs_log.touch()
        try:
            began = time.perf_counter()
            active = fill_active(engine, sizes["active"])
            report["seeding"]["active_runs_s"] = round(time.perf_counter() - began, 1)
            command = server_command(REPO_ROOT, url, port, jobs_log, len(active), args.workers)
            if args.py_spy:
                command = under_py_spy(command, args.py_spy)
            server = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
            try:
                base = f"http://127.0.0.1:{port}"
                began = time.perf_counter()
                wait_until_up(base, server)
                report["server_start_s"] = round(time.perf_counter() - began, 1)
                stored, metric_runs = [], []
                for index, size in enumerate(sizes["sizes"]):
                    began = time.perf_counter()
                    stored += fill(engine, size - len(stored), first=len(stored), settle=False)
                    seeding = {"runs_s": round(time.perf_counter() - began, 1)}
                    if index == len(sizes["sizes"]) - 1 and sizes["metric_points"]:
                        began = time.perf_counter()
                        metric_runs = stored[-sizes["metric_runs"]:]
                        points = copy_metrics(engine, metric_runs, sizes["metric_points"] // len(metric_runs))
                        seeding.update(metric_points=points, metric_runs=len(metric_runs),
                                       metrics_copy_s=round(time.perf_counter() - began, 1))
                    began = time.perf_counter()
                    vacuum_analyze(engine)
                    seeding["vacuum_analyze_s"] = round(time.perf_counter() - began, 1)
                    report["seeding"][str(size)] = seeding
                    server_pid = server.pid if not args.py_spy else _child_pid(server.pid)
                    result = asyncio.run(measure_size(base, jobs_log, server_pid, sizes, metric_runs, stored,
                                                      engine, seed=index))
                    result["metric_points_stored"] = _metric_count(engine)
                    report["sizes"][str(size)] = result
                    print(f"{size} runs: {json.dumps(result)}", file=sys.stderr)
                report["tick"] = tick_phase(url, active, sizes["ticks"])
            finally:
                stop_server(server, under_py_spy=bool(args.py_spy))
        finally:
            engine.dispose()
    largest = report["sizes"][str(sizes["sizes"][-1])]
    report["goals"] = ratios(report, largest)
    report["all_requests_succeeded"] = all(
        _failed(phase) == 0 for size in report["sizes"].values() for phase in size.values() if isinstance(phase, dict))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


def server_command(tree: Path, url: str, port: int, jobs_log: Path, active: int, workers: int = 1) -> list[str]:
    """The command that starts ``tree``'s ``bench/control_plane_server.py`` on ``url`` (with
    ``workers`` API processes; the flag is left out for one, which older trees do not know)."""
    return [sys.executable, str(tree / "bench" / "control_plane_server.py"), "--db", url, "--port", str(port),
            "--key", BENCH_KEY, "--jobs-log", str(jobs_log), "--active", str(active),
            *(["--workers", str(workers)] if workers != 1 else [])]


def short_commit(tree: Path) -> str:
    """``tree``'s commit, with ``+changes`` when its tracked files differ from it (a figure
    measured from uncommitted code must not carry the commit's name alone)."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True)

    changed = git("diff", "--quiet", "HEAD").returncode == 1  # 0: none; above 1: git failed
    return git("rev-parse", "--short", "HEAD").stdout.strip() + ("+changes" if changed else "")


def under_py_spy(command: list[str], profile: Path) -> list[str]:
    """``command`` run by ``py-spy record``: GIL-holding samples, as collapsed stacks in ``profile``."""
    return [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw", "--rate", "50", "--gil",
            "--subprocesses", "-o", str(profile), "--"] + command


def stop_server(server: subprocess.Popen, *, under_py_spy: bool) -> None:
    """Stop the server before its database is dropped. Under py-spy, SIGINT the server itself:
    py-spy then writes its profile and exits with it (a SIGTERM to py-spy would orphan it)."""
    if under_py_spy and server.poll() is None:
        child = _child_pid(server.pid)
        if child != server.pid:
            os.kill(child, signal.SIGINT)
    else:
        server.terminate()
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def _child_pid(pid: int) -> int:
    """The server under ``py-spy record``: its (only) child."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else pid


def _failed(phase: dict) -> int:
    """Failed requests of a phase: its own tally, its ``requests`` one, or its tallies' (sweep)."""
    if "failed" in phase:
        return phase["failed"]
    return sum(part["failed"] for part in phase.values() if isinstance(part, dict) and "failed" in part)


def _metric_count(engine) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM metrics")).scalar_one()


if __name__ == "__main__":
    main()
