"""A job's log, as the service's jobs are run, keeps every line its workers print: Ray's driver
folds lines that several workers print within seconds into "[repeated 2x across cluster]" unless
told not to, which cut two ranks' identical tracebacks into fragments."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from ray.job_submission import JobStatus, JobSubmissionClient

from service.job_kinds import RUN_JOBS
from service.settings import Settings
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.integration

LINE = "the same line from every worker"
PRINTS_THE_SAME_LINE_FROM_THREE_WORKERS = f"""
import ray
ray.init()

@ray.remote(num_cpus=0)
class Worker:  # an actor each: three processes, as three ranks are
    def say(self, line):
        print(line, flush=True)

workers = [Worker.remote() for _ in range(3)]
ray.get([worker.say.remote("{LINE}") for worker in workers])
"""


def test_a_jobs_log_keeps_every_line_each_worker_printed(ray_head, tmp_path):
    record = SimpleNamespace(id="log-lines", attempt=1, project="default")
    env = RUN_JOBS.job_env(Settings(home=tmp_path / "home"), record, token="unused")
    ray_env = {name: value for name, value in env.items() if name.startswith("RAY_")}  # how Ray is told to print
    jobs = JobSubmissionClient(ray_head.dashboard_url)
    job = jobs.submit_job(entrypoint=f"{sys.executable} -c '{PRINTS_THE_SAME_LINE_FROM_THREE_WORKERS}'",
                          runtime_env={"env_vars": ray_env})
    try:
        wait_until(lambda: jobs.get_job_status(job) in (JobStatus.SUCCEEDED, JobStatus.FAILED), timeout=120,
                   what="the job to end")
        log = jobs.get_job_logs(job)
        assert jobs.get_job_status(job) is JobStatus.SUCCEEDED, log
        printed = [line for line in log.splitlines() if line.startswith("(Worker pid=")]
        assert len({line.split(")")[0] for line in printed}) == 3, log  # three processes printed
        assert [line.split(") ", 1)[1] for line in printed] == [LINE] * 3 and "[repeated" not in log, log
    finally:
        jobs.delete_job(job)
