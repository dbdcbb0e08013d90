"""Warming the job drivers' interpreter on a Ray cluster the service did not start.

A run's or sweep's job driver is forked from a warm interpreter on its node (``workers.fork_exec``),
which saves it the imports of torch and Ray Train (~2.3 s on 2 cores). Where none runs yet, the
driver pays them and starts one for the next. An embedded head's start-up probe starts it before
the first run (``service.ray_head``); on an external cluster the first run after the service
starts, and the first after the cluster's head restarted (a new cluster: its node's interpreter
went with the old one), would start cold.

``DriverWarmup`` submits the same one-line job there: once the dispatcher first reaches Ray, and
again whenever Ray answers after a tick in which it did not. The job has the environment every
job of the service starts from (``ray_head.common_job_env``), so the interpreter it starts is the
one a run's driver asks for (``workers.fork_exec.server_key`` leaves the per-job variables out).
A job runs on the head node, as every driver does. Once it has finished, Ray is told to forget
it, so Ray's job list, read every tick, does not grow by a job per service start. Best effort
throughout: a refused or unanswered warm-up costs the next run its imports, nothing more.
"""

from __future__ import annotations

import logging
import os
import secrets

from service.ray_client import LIVE_JOB_STATES, JobsClient, RayRefused, RayUnavailable
from service.ray_head import common_job_env, warm_drivers_entrypoint
from service.settings import Settings

log = logging.getLogger(__name__)

JOB_PREFIX = "tessera-warm-drivers-"


class DriverWarmup:
    """The warm-up job of one dispatching process; the dispatcher calls ``tick`` on each tick
    that read Ray's job list and ``ray_lost`` on each that could not."""

    def __init__(self, jobs: JobsClient, settings: Settings):
        self.jobs = jobs
        self.settings = settings
        # An embedded head's probe warms its node; TESSERA_DRIVER_FORKS=0 (forwarded to jobs) turns
        # the interpreter off (workers.fork_exec).
        self.wanted = settings.ray_address is not None and os.environ.get("TESSERA_DRIVER_FORKS", "1") != "0"
        self.due = self.wanted
        self.job_id: str | None = None  # submitted, not yet forgotten

    def ray_lost(self) -> None:
        """Ray did not answer: the cluster that answers next may be a new one."""
        self.due = self.wanted

    def tick(self, states: dict[str, str] | None) -> None:
        """Forget a finished warm-up job; submit one if due. ``states``: Ray's job list as this
        tick read it (None: the client cannot list, so ask about the job)."""
        try:
            if self.job_id is not None:
                state = states.get(self.job_id) if states is not None else self.jobs.status(self.job_id)
                if state is not None:  # Ray has it (after an unanswered submit too): this cluster is warmed
                    self.due = False
                if state not in LIVE_JOB_STATES:
                    if state is not None:
                        self.jobs.delete(self.job_id)
                    self.job_id = None
            if self.due and self.job_id is None:
                self.job_id = f"{JOB_PREFIX}{secrets.token_hex(4)}"  # kept if the submit goes unanswered
                self.jobs.submit(self.job_id, warm_drivers_entrypoint(self.settings.worker_python), common_job_env())
                self.due = False
        except RayRefused as exc:  # this cluster will not run it: the next driver starts cold
            log.warning("Ray refused the drivers' warm-up job: %s", exc)
            self.due, self.job_id = False, None
        except RayUnavailable as exc:  # tried again on a later tick
            log.info("the drivers' warm-up job waits for Ray: %s", exc)
