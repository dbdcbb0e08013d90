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


def connect_driver() -> None:
    """``ray.init()`` unless connected, passing this job's cluster address on to its workers."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get(ADDRESS_VARIABLE)
    ray.init(runtime_env={"env_vars": {ADDRESS_VARIABLE: address}} if address else None)
