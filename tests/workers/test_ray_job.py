"""A job's driver hands its cluster's address to the job's workers (workers/ray_job.py)."""

from __future__ import annotations

import ray

from workers.ray_job import connect_driver


def test_the_driver_passes_the_jobs_cluster_address_to_its_workers(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what Ray's job supervisor sets for the entrypoint
    monkeypatch.setenv("RAY_ADDRESS", "192.0.2.2:46507")
    connect_driver()
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")  # a Ray Client address is no GCS address
    connect_driver()
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # a notebook's: its workers may be elsewhere
    connect_driver()
    assert calls == [{"runtime_env": {"env_vars": {"RAY_ADDRESS": "192.0.2.2:46507"}}}, {"runtime_env": None},
                     {"runtime_env": None}]
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    connect_driver()  # connected already: nothing
    assert len(calls) == 3
