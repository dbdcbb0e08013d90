"""Training without the service, for ``tessera train FILE`` and notebooks.

A single-worker run (strategy ``none``) trains in this process: no Ray, no process group.
A DDP/FSDP run starts a local Ray (unless one is connected) and goes through ``fit_with_ray``.

Checkpoints use the service's layout, ``{checkpoint_dir}/runs/{spec.name}/checkpoints`` (the
CLI's default ``checkpoint_dir`` is ``$TESSERA_HOME/local``, i.e. ``.tessera/local``): running
the same spec again resumes from its newest committed checkpoint, whichever way it was run
before (a one-worker checkpoint reshards onto DDP workers and back).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from api.specs import RunSpec
from workers.checkpoint import CheckpointInfo, Checkpointer, join, normalize_url, storage_for
from workers.reporter import ConsoleReporter, MetricSink
from workers.trainer import train

REPO_ROOT = Path(__file__).resolve().parent.parent


def default_checkpoint_dir() -> str:
    """``$TESSERA_HOME/local`` as an absolute path (Ray workers run in another folder)."""
    return str(Path(os.environ.get("TESSERA_HOME", ".tessera")).resolve() / "local")


def local_run_url(spec: RunSpec, checkpoint_dir: str | None = None) -> str:
    """The folder of ``spec``'s local run: ``{checkpoint_dir}/runs/{spec.name}``."""
    return join(normalize_url(checkpoint_dir or default_checkpoint_dir()), "runs", spec.name)


def latest_local_checkpoint(spec: RunSpec, checkpoint_dir: str | None = None) -> CheckpointInfo | None:
    """The committed checkpoint a local run of ``spec`` would resume from, if any."""
    return Checkpointer(join(local_run_url(spec, checkpoint_dir), "checkpoints"), fingerprint={}).latest_committed()


def train_local(spec: RunSpec, *, sink: MetricSink | None = None,
                checkpoint_dir: str | None = None) -> dict[str, float]:
    """Train ``spec`` on this machine; returns the final metrics.

    With ``checkpoint_dir`` (``tessera train`` passes ``default_checkpoint_dir()`` unless told
    otherwise) the run saves under ``local_run_url(spec, checkpoint_dir)`` (every
    ``spec.checkpoint.interval`` and at the end) and resumes from its newest committed
    checkpoint; a checkpoint of a spec with another model or optimizer is refused with
    ``IncompatibleCheckpoint``. Without one, nothing is saved.

    In-process runs report every point to ``sink`` (default: ``ConsoleReporter``). DDP runs
    print progress from rank 0 through Ray's log forwarding, and only the final metrics reach
    ``sink``.
    """
    parallelism = spec.parallelism
    if parallelism.strategy == "none" and parallelism.num_workers == 1:
        checkpoint_url = join(local_run_url(spec, checkpoint_dir), "checkpoints") if checkpoint_dir else None
        return train(spec, sink=sink if sink is not None else ConsoleReporter(), checkpoint_url=checkpoint_url)
    return _train_with_local_ray(spec, sink, normalize_url(checkpoint_dir) if checkpoint_dir else None)


def _train_with_local_ray(spec: RunSpec, sink: MetricSink | None, storage_url: str | None) -> dict[str, float]:
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
        if storage_url is None:
            metrics = fit_with_ray(spec, run_id=f"local-{spec.name}-{uuid.uuid4().hex[:8]}")
        else:  # checkpoints in {storage_url}/runs/{spec.name}/checkpoints, as in-process runs
            attempt = _next_attempt(join(storage_url, "runs", spec.name))
            metrics = fit_with_ray(spec, run_id=spec.name, storage_url=storage_url, attempt=attempt)
    finally:
        if started:
            ray.shutdown()
    if sink is not None:
        step = int(metrics.get("time/batch", 0))
        for key, value in metrics.items():
            sink.add(step, key, value)
        sink.close()
    return metrics


def _next_attempt(run_url: str) -> int:
    """A fresh attempt number per invocation, so a re-run is not reported as a restart of the
    previous one (``fit_with_ray`` marks each attempt it starts under ``{run}/attempts``)."""
    return len(storage_for(run_url).listdir(join(run_url, "attempts"))) + 1
