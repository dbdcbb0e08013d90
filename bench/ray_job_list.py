"""The dispatcher's one Ray call a tick, Ray's job list, against the finished jobs Ray remembers.

    PYTHONPATH=. .venv/bin/python bench/ray_job_list.py [--finished 1000,5000] [--rounds 5] \
        [--out docs/bench/ray-job-list-DATE.json]

Each dispatcher tick reads every job's state with one ``GET /api/jobs/`` (``RayJobsClient.states``).
Ray answers it with every submission job it has not been told to forget, finished ones too,
so unless finished jobs are deleted the call grows with every run the cluster ever ran. The log
archiver deletes a run attempt's (or sweep driver's) job once its final log is stored
(``service/log_archive.py``); this measures what that saves, on a real Ray head started here:

1. one real job (``python -c pass``) is submitted and waited for; its stored record is the
   template for the rest;
2. ``baseline``: the job list's wall time (median of ``--rounds`` calls) with no finished job
   kept, the time an archiver that keeps up leaves a tick with;
3. for each size in ``--finished``: that many finished jobs are written into Ray's job store
   the way Ray's job manager stores one (``JobInfoStorageClient``'s key and JSON, copied from
   the real job; submitting each through Ray would start a supervisor and a driver process per
   job), and the list is timed again;
4. ``forgotten``: every one of them is deleted through ``RayJobsClient.delete`` (the archiver's
   call; its median time is reported), and the list is timed again.

Prints each figure and its ratio to the baseline. The service's own cost of a call (its thread's
CPU parsing the answer) is reported beside the wall time, which is mostly Ray's dashboard.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from bench.control_plane import short_commit  # noqa: E402
from service.ray_client import FINISHED_JOB_STATES, RayJobsClient  # noqa: E402
from tests.local_ray import RayHead  # noqa: E402


def time_list(client: RayJobsClient, rounds: int) -> dict[str, float]:
    """Median wall and calling-thread CPU of ``states()`` over ``rounds`` calls (after one untimed)."""
    client.states()
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.thread_time()
        listed = client.states()
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {"wall_ms": round(statistics.median(walls) * 1000, 2), "client_cpu_ms": round(statistics.median(cpus) * 1000, 2),
            "jobs_listed": len(listed)}


def finished_template(client: RayJobsClient, gcs, namespace: str, key_of) -> bytes:
    """The stored record of one real job, submitted here and waited for."""
    client.submit("bench-template", f"{sys.executable} -c pass", {"TESSERA_RUN_ID": "bench", "TESSERA_ATTEMPT": "1"})
    deadline = time.monotonic() + 300
    while client.status("bench-template") not in FINISHED_JOB_STATES:
        if time.monotonic() > deadline:
            raise SystemExit("the template job did not finish within 300 s")
        time.sleep(0.5)
    return gcs.internal_kv_get(key_of("bench-template").encode(), namespace=namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--finished", default="1000,5000", help="sizes of the finished-job history, comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per figure (default 5)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    sizes = [int(size) for size in args.finished.split(",")]

    from ray._private import ray_constants
    from ray._raylet import GcsClient
    from ray.dashboard.modules.job.common import JobInfoStorageClient

    namespace = ray_constants.KV_NAMESPACE_JOB
    key_of = JobInfoStorageClient.JOB_DATA_KEY.format
    load_before = os.getloadavg()
    head = RayHead(num_cpus=2, timeout_s=180)
    client = RayJobsClient(head.dashboard_url, timeout_s=120)
    try:
        gcs = GcsClient(address=head.address)
        # Kept: deleted at once, Ray's job manager would write it again (``service/log_archive.py``).
        template = json.loads(finished_template(client, gcs, namespace, lambda job: key_of(job_id=job)))
        record = json.dumps(template).encode()
        print(f"one finished job's record: {len(record)} bytes", flush=True)
        baseline = time_list(client, args.rounds)
        print(f"baseline (no finished job kept): {baseline}", flush=True)
        results, kept = [], 0
        for size in sizes:
            for index in range(kept, size):
                gcs.internal_kv_put(key_of(job_id=f"run-b{index:011x}-attempt-1").encode(), record, True,
                                    namespace=namespace)
            kept = size
            listed = time_list(client, args.rounds)
            ratio = round(listed["wall_ms"] / baseline["wall_ms"], 1)
            results.append({"finished_jobs_kept": size, **listed, "wall_over_baseline": ratio})
            print(f"{size:>6} finished jobs kept: {listed}, wall {ratio}x the baseline", flush=True)
        deletes = []
        for index in range(kept):
            started = time.perf_counter()
            client.delete(f"run-b{index:011x}-attempt-1")
            deletes.append(time.perf_counter() - started)
        forgotten = time_list(client, args.rounds)
        forgotten_ratio = round(forgotten["wall_ms"] / baseline["wall_ms"], 2)
        delete_ms = round(statistics.median(deletes) * 1000, 2)
        print(f"after deleting all {kept} (median delete {delete_ms} ms): {forgotten}, "
              f"wall {forgotten_ratio}x the baseline", flush=True)
    finally:
        client.close()
        head.stop()
    report = {"bench": "ray_job_list", "date": date.today().isoformat(), "commit": short_commit(REPO_ROOT),
              "command": " ".join(["bench/ray_job_list.py", *sys.argv[1:]]),
              "machine": "2 CPU cores shared with other jobs", "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "record_bytes": len(record), "rounds": args.rounds,
              "baseline": baseline, "kept": results,
              "forgotten": {**forgotten, "wall_over_baseline": forgotten_ratio, "delete_median_ms": delete_ms}}
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
