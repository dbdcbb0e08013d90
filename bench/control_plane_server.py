"""The service as ``bench/control_plane.py`` loads it: the real app under uvicorn, Ray faked.

    PYTHONPATH=. python bench/control_plane_server.py --db URL --port N --key KEY --jobs-log FILE --active N \
        [--workers N]

A process of its own, as in production (the load generator would otherwise share its GIL).
The dispatcher thread runs at its default interval. ``ListingRay`` stands in for Ray's Jobs
API: submits are accepted (each job RUNNING at once) and appended to ``--jobs-log`` as JSON
lines with the attempt's token, which is how the bench gets tokens the way the tests do (from
the submitted job's environment); ``states()`` lists every job in one call, as ``RayJobsClient``
does, including ``--active`` jobs of ``bench.seed.fill_active``'s runs.

With ``--workers N`` (above 1), N processes serve it as ``tessera serve --workers N`` does
(``service.processes.supervise``), each building the app with ``build_app`` from the arguments
in ``SERVER_ARGS_ENV``; the one holding the dispatch lease submits to its ``ListingRay``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class ListingRay:
    """A Ray Jobs API that accepts every submit and lists all its jobs in one call."""

    def __init__(self, active_job_ids: list[str], jobs_log: Path | None = None):
        self.jobs = {job_id: "RUNNING" for job_id in active_job_ids}
        self.jobs_log = jobs_log
        self._lock = threading.Lock()

    def submit(self, submission_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        with self._lock:
            if submission_id in self.jobs:
                return  # Ray refuses a duplicate id; the JobsClient contract makes that a no-op
            self.jobs[submission_id] = "RUNNING"
            if self.jobs_log is not None:
                with self.jobs_log.open("a") as log:
                    log.write(json.dumps({"job": submission_id, "token": env_vars.get("TESSERA_RUN_TOKEN")}) + "\n")

    def status(self, submission_id: str) -> str | None:
        return self.jobs.get(submission_id)

    def states(self) -> dict[str, str]:
        with self._lock:
            return dict(self.jobs)

    def stop(self, submission_id: str) -> None:
        with self._lock:
            if submission_id in self.jobs:
                self.jobs[submission_id] = "STOPPED"

    def logs_tail(self, submission_id: str, lines: int = 40) -> str:
        return ""

    def job_logs(self, submission_id: str) -> str | None:
        return "" if submission_id in self.jobs else None

    def delete(self, submission_id: str) -> None:
        with self._lock:
            self.jobs.pop(submission_id, None)


def active_job_ids(count: int) -> list[str]:
    """The Ray jobs of ``bench.seed.fill_active(engine, count)``'s runs."""
    return [f"run-a{i:011x}-attempt-1" for i in range(count)]


SERVER_ARGS_ENV = "TESSERA_BENCH_SERVER_ARGS"


def settings_for(args: dict):
    from service.settings import Settings

    return Settings(home=Path(args["home"]), database_url=args["db"], bootstrap_api_key=args["key"],
                    public_url=f"http://127.0.0.1:{args['port']}", worker_python=sys.executable,
                    workers=args["workers"])


def build_app(args: dict | None = None):
    """The app for ``args`` (``main``'s arguments and ``home``; default: from ``SERVER_ARGS_ENV``)."""
    from service.app import create_app

    args = args or json.loads(os.environ[SERVER_ARGS_ENV])
    return create_app(settings_for(args), jobs=ListingRay(active_job_ids(args["active"]), Path(args["jobs_log"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help="the admin API key the load generator uses")
    parser.add_argument("--jobs-log", type=Path, required=True)
    parser.add_argument("--active", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="API processes (uvicorn workers)")
    args = parser.parse_args()

    import uvicorn

    with tempfile.TemporaryDirectory() as home:
        server_args = {**vars(args), "jobs_log": str(args.jobs_log), "home": home}
        # Keep-alive longer than any pause between the bench's phases: uvicorn's 5 s default closes
        # an idle connection just as the client may reuse it (a ReadError that is not the service's).
        serving = {"host": "127.0.0.1", "port": args.port, "log_level": "warning", "access_log": False,
                   "timeout_keep_alive": 300}
        if args.workers == 1:
            uvicorn.run(build_app(server_args), **serving)
            return
        from service.processes import MULTIPROC_DIR_ENV, prepare_database, supervise

        prepare_database(settings_for(server_args))  # as service.processes.serve_processes does
        os.environ[SERVER_ARGS_ENV] = json.dumps(server_args)
        with tempfile.TemporaryDirectory() as metrics_dir:
            os.environ[MULTIPROC_DIR_ENV] = metrics_dir  # as service.processes.serve_processes does
            supervise(uvicorn.Config("bench.control_plane_server:build_app", factory=True, **serving), args.workers)


if __name__ == "__main__":
    main()
