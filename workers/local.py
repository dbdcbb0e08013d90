"""Training without the service, for ``tessera train FILE`` and notebooks.

A single-worker run (strategy ``none``) trains in this process: no Ray, no process group.
A DDP/FSDP run starts a local Ray (unless one is connected) and goes through ``fit_with_ray``;
when it fails or is interrupted, this process ends the MLflow runs its ranks left RUNNING. A Ray
it started is shut down after the run, and this process's environment is as it was before.

Checkpoints use the service's layout (``workers.paths``) with ``checkpoint_dir`` as the storage
root and the spec's name as the run id (the CLI's default ``checkpoint_dir`` is
``$TESSERA_HOME/local``, i.e. ``.tessera/local``): running
the same spec again resumes from its newest committed checkpoint, whichever way it was run
before (a one-worker checkpoint reshards onto DDP workers and back).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator

from api.specs import RunSpec
from workers.checkpoint import CheckpointInfo, Checkpointer, normalize_url, storage_for
from workers.loggers import closed_at_end, end_failed_mlflow_runs, end_interrupted_mlflow_runs, with_loggers
from workers.local_ray import SETUP_HOOK, private_temp_dir, signal_handlers_restored, worker_temp_env
from workers.paths import attempts_url, checkpoints_url, default_local_root, run_url
from workers.reporter import ConsoleReporter, MetricSink
from workers.ray_job import ADDRESS_VARIABLE
from workers.trainer import train

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
GCS_PORT_VARIABLE = "RAY_GCS_SERVER_PORT"  # read by Ray's head as it starts (ray._private.ray_constants)


def default_checkpoint_dir() -> str:
    """``$TESSERA_HOME/local`` as an absolute path (Ray workers run in another folder)."""
    return default_local_root()


def local_run_url(spec: RunSpec, checkpoint_dir: str | None = None) -> str:
    """The folder of ``spec``'s local run: ``{checkpoint_dir}/runs/{spec.name}``."""
    return run_url(checkpoint_dir or default_checkpoint_dir(), spec.name)


def latest_local_checkpoint(spec: RunSpec, checkpoint_dir: str | None = None) -> CheckpointInfo | None:
    """The committed checkpoint a local run of ``spec`` would resume from, if any."""
    return Checkpointer(checkpoints_url(local_run_url(spec, checkpoint_dir)), fingerprint={}).latest_committed()


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
    ``sink``. Either way ``sink`` is closed at the end, and the spec's loggers (written by the
    process that trains rank 0) end their runs with the outcome: MLflow's FINISHED, FAILED when
    training raises, KILLED when interrupted (``workers.loggers.closed_at_end``).
    """
    parallelism = spec.parallelism
    if parallelism.strategy == "none" and parallelism.num_workers == 1:
        run = local_run_url(spec, checkpoint_dir) if checkpoint_dir else None
        sink = with_loggers(sink if sink is not None else ConsoleReporter(), spec, run, run_id=spec.name)
        with closed_at_end(sink):
            return train(spec, sink=sink, checkpoint_url=checkpoints_url(run) if run else None)
    return _train_with_local_ray(spec, sink, normalize_url(checkpoint_dir) if checkpoint_dir else None)


def _train_with_local_ray(spec: RunSpec, sink: MetricSink | None, storage_url: str | None) -> dict[str, float]:
    import ray

    if ray.is_initialized():  # a Ray the caller connected to: the caller's, environment included
        return _fit_on_ray(spec, sink, storage_url, shut_down=False)
    # ray.init, and the variables set for a private Ray, change this process's environment
    # (RAY_AUTH_MODE, PYTHONBREAKPOINT set to Ray's debugger, ...) and its SIGINT and SIGTERM
    # handlers: a notebook's later code must not inherit them. Ray's session files, and its
    # workers' temporary ones, go to a folder of this run's, removed after it.
    with environment_restored(), signal_handlers_restored() as put_back_handlers, private_temp_dir() as temp_dir:
        try:
            _start_private_ray(spec, temp_dir)
        except BaseException:  # a Ctrl-C while Ray starts: what has started stops before its folder goes
            ray.shutdown()
            raise
        put_back_handlers()  # SIGTERM's: ray.init's, and its core worker's crash handler, end the CLI in SIGABRT
        return _fit_on_ray(spec, sink, storage_url, shut_down=True)


def _fit_on_ray(spec: RunSpec, sink: MetricSink | None, storage_url: str | None, *,
                shut_down: bool) -> dict[str, float]:
    """``fit_with_ray`` on the connected Ray, then ``ray.shutdown()`` if ``shut_down``."""
    import ray

    from workers.ray_train import fit_with_ray

    run_id = spec.name if storage_url is not None else f"local-{spec.name}-{uuid.uuid4().hex[:8]}"
    started_ms = int(time.time() * 1000)  # a run id of a spec's name: another train of it may be running
    try:
        try:
            if storage_url is None:
                metrics = fit_with_ray(spec, run_id=run_id)
            else:  # the same run folder as in-process runs: the spec's name is the run id
                attempt = _next_attempt(run_url(storage_url, spec.name))
                metrics = fit_with_ray(spec, run_id=run_id, storage_url=storage_url, attempt=attempt)
        finally:
            if shut_down:
                ray.shutdown()
    except BaseException as exc:
        # A rank 0 that raised ended its MLflow run FAILED; one Ctrl-C (or a SIGTERM: see
        # ``tessera train``) stopped, or one killed, could not: its ranks die with Ray.
        ended = end_interrupted_mlflow_runs if not isinstance(exc, Exception) else end_failed_mlflow_runs
        ended(spec, run_id, started_after_ms=started_ms)
        if isinstance(exc, SystemExit):
            # Only signal handlers raise one in this process: Ray Train's SIGINT handler aborts its
            # controller and calls sys.exit(0) (ray/train/v2/api/data_parallel_trainer.py:295-321),
            # ray.init's SIGTERM handler sys.exit(15). Raised while ray.get waits, Ray's core worker
            # makes it SystemExit(1) whatever the code (hence Ray's own comment there: "for some
            # reason the process still exits with 1"): a Ctrl-C'd tessera train ended with status 1
            # and no word. Callers get the interrupt they sent, as from an in-process run.
            raise KeyboardInterrupt from exc
        raise
    if sink is not None:
        step = int(metrics.get("time/batch", 0))
        for key, value in metrics.items():
            sink.add(step, key, value)
        sink.close()
    return metrics


def _start_private_ray(spec: RunSpec, temp_dir: str) -> None:
    """Start a local Ray for ``spec``'s workers (or connect to ``RAY_ADDRESS``'s), to be shut
    down after the run; a Ray it starts keeps its files in ``temp_dir`` (``private_temp_dir``)."""
    # One extra CPU for Ray Train's controller; and at least 4 logical CPUs: on a 2-core
    # machine, Ray told the real count starves the worker group, whose start then waits
    # forever (WorkerGroupStartupTimeoutError on every retry).
    needed = spec.parallelism.num_workers * spec.parallelism.cpus_per_worker + 1
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    # A private, short-lived Ray, as the service's embedded head is (service/ray_head.py):
    # Ray 2.60 would otherwise make a cluster token and leave it in ~/.ray/auth_token. Kept while
    # this process is connected (until ray.shutdown), not only while the head starts: Ray reads
    # the mode again as its driver connects.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    address = _start_local_ray(num_cpus=max(4, needed), env_vars={"PYTHONPATH": pythonpath}, temp_dir=temp_dir)
    log.info("local Ray at %s for %d workers", address, spec.parallelism.num_workers)


@contextlib.contextmanager
def environment_restored() -> Iterator[None]:
    """Within the block, ``os.environ`` may change; after it, every variable is as it was
    before (added ones removed), whether the block ends or raises."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for key in os.environ.keys() - before.keys():
            del os.environ[key]
        for key, value in before.items():
            if os.environ.get(key) != value:  # only those that changed: the rest stay untouched
                os.environ[key] = value


def _start_local_ray(*, num_cpus: int, env_vars: dict[str, str], temp_dir: str) -> str:
    """``ray.init`` of a new local cluster whose GCS address every worker knows as
    ``RAY_ADDRESS``; returns the address.

    Ray Train's placement-group cleaner looks the cluster up again through Ray's state API
    (``workers.ray_job`` says where). Without ``RAY_ADDRESS`` that lookup searches the machine,
    and with another cluster there (the service's, in the README's tour) it failed with "Found
    multiple active Ray instances": a traceback amid the train's output. The address is known only
    once the cluster runs, and a job's environment is fixed as it connects, so the GCS port is
    chosen first: Ray's head takes it from ``RAY_GCS_SERVER_PORT`` (ray/_private/node.py, 2.60).

    A cluster it starts runs without a dashboard, so its workers drop Ray Train's warning that the
    state API cannot be queried (``workers.local_ray.SETUP_HOOK``), and its session and its
    workers' temporary files go to ``temp_dir`` (``workers.local_ray.private_temp_dir``)."""
    import ray

    if os.environ.get(ADDRESS_VARIABLE):  # ray.init connects there (no num_cpus for a cluster that runs)
        ray.init(runtime_env={"env_vars": env_vars})
        return os.environ[ADDRESS_VARIABLE]
    port = _unused_port()
    address = f"{ray.util.get_node_ip_address()}:{port}"
    before = os.environ.get(GCS_PORT_VARIABLE)
    os.environ[GCS_PORT_VARIABLE] = str(port)
    env_vars = {**env_vars, ADDRESS_VARIABLE: address, **worker_temp_env(temp_dir)}
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                 runtime_env={"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK})
    finally:
        if before is None:
            os.environ.pop(GCS_PORT_VARIABLE, None)
        else:
            os.environ[GCS_PORT_VARIABLE] = before
    actual = ray.get_runtime_context().gcs_address
    if actual.rsplit(":", 1)[-1] != str(port):  # a Ray that no longer reads the variable
        log.warning("the local Ray's GCS is at %s, not on port %d as asked (%s): Ray Train's lookups may find "
                    "another cluster on this machine", actual, port, GCS_PORT_VARIABLE)
    return actual


def _unused_port() -> int:
    """A TCP port no one listens on now (the kernel's pick; Ray's GCS binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _next_attempt(run: str) -> int:
    """A fresh attempt number per invocation, so a re-run is not reported as a restart of the
    previous one (``fit_with_ray`` marks each attempt it starts under ``{run}/attempts``)."""
    return len(storage_for(run).listdir(attempts_url(run))) + 1
