"""Training without the service, for ``tessera train FILE`` and notebooks.

A single-worker run (strategy ``none``) trains in this process: no Ray, no process group.
A DDP run starts a local Ray (unless one is connected) and goes through ``fit_with_ray``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from api.specs import RunSpec
from workers.reporter import ConsoleReporter, MetricSink
from workers.trainer import train

REPO_ROOT = Path(__file__).resolve().parent.parent


def train_local(spec: RunSpec, *, sink: MetricSink | None = None) -> dict[str, float]:
    """Train ``spec`` on this machine; returns the final metrics.

    In-process runs report every point to ``sink`` (default: ``ConsoleReporter``). DDP runs
    print progress from rank 0 through Ray's log forwarding, and only the final metrics reach
    ``sink``.
    """
    parallelism = spec.parallelism
    if parallelism.strategy == "none" and parallelism.num_workers == 1:
        return train(spec, sink=sink if sink is not None else ConsoleReporter())
    return _train_with_local_ray(spec, sink)


def _train_with_local_ray(spec: RunSpec, sink: MetricSink | None) -> dict[str, float]:
    import ray

    from workers.ray_train import fit_with_ray

    started = False
    if not ray.is_initialized():
        # One extra CPU for Ray Train's controller; at least 4 logical CPUs so small machines
        # don't starve the worker group (see ENVIRONMENT.md).
        needed = spec.parallelism.num_workers * spec.parallelism.cpus_per_worker + 1
        pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        ray.init(num_cpus=max(4, needed), include_dashboard=False,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        started = True
    try:
        metrics = fit_with_ray(spec, run_id=f"local-{spec.name}-{uuid.uuid4().hex[:8]}")
    finally:
        if started:
            ray.shutdown()
    if sink is not None:
        step = int(metrics.get("time/batch", 0))
        for key, value in metrics.items():
            sink.add(step, key, value)
        sink.close()
    return metrics
