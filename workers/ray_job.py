"""A Ray job's driver connecting to its cluster (``workers.launch``, ``workers.tune.driver``).

Inside a Ray job, ``ray.init()`` finds the cluster through ``RAY_ADDRESS``, the GCS address
that Ray's job supervisor sets for the entrypoint alone (Ray 2.60:
ray/dashboard/modules/job/job_supervisor.py, ``_get_driver_env_vars``). Ray Train's own actors
look the cluster up again: the placement-group cleaner asks the state API whether the
controller lives (ray/train/v2/_internal/state/util.py, ``is_actor_alive``). Without
``RAY_ADDRESS`` that lookup searches the machine for running clusters, and with a second one
there (a ``tessera train`` beside the service, another service's Ray) it fails with "Found
multiple active Ray instances": a traceback in the run's log, and a cleaner that no longer
watches. The driver hands its address to every worker of the job through the job's runtime
environment; Ray merges those variables with the job's own (it refuses only a name both set,
and the service's job environment never sets this one).
"""

from __future__ import annotations

import os

ADDRESS_VARIABLE = "RAY_ADDRESS"
# Set by Ray's job supervisor for a job's entrypoint (ray/_private/runtime_env/constants.py).
JOB_CONFIG_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# Set by the service for each attempt's job (service.job_kinds): the run's or the sweep's attempt.
ATTEMPT_VARIABLE = "TESSERA_ATTEMPT"


def job_attempt() -> int:
    """The attempt this job is, from ``TESSERA_ATTEMPT`` (1 when unset). Raises ``ValueError``
    naming the variable and its value for anything but a whole number from 1: the job's entry
    point says so as it refuses to start, as for a missing variable."""
    text = os.environ.get(ATTEMPT_VARIABLE, "1")
    try:
        attempt = int(text)
    except ValueError:
        attempt = 0
    if attempt < 1:
        raise ValueError(f"{ATTEMPT_VARIABLE} must be a whole number from 1, not {text[:100]!r}")
    return attempt


def connect_driver() -> None:
    """``ray.init()`` unless connected; inside a Ray job, passing its cluster's GCS address on to
    its workers. Elsewhere (a notebook's ``run_sweep``) ``RAY_ADDRESS`` may be a Ray Client
    ``ray://`` address or one only this machine resolves: it is left to Ray as it was."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get(ADDRESS_VARIABLE)
    in_job = JOB_CONFIG_VARIABLE in os.environ and address and "://" not in address
    ray.init(runtime_env={"env_vars": {ADDRESS_VARIABLE: address}} if in_job else None)
