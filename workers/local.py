"""Training without the service, for ``tessera train FILE`` and notebooks.

A single-worker run (strategy ``none``) trains in this process: no Ray, no process group.
A DDP/FSDP run starts a local Ray (unless one is connected) and goes through ``fit_with_ray``;
when it fails or is interrupted, this process ends the MLflow runs its ranks left RUNNING. A Ray
it started is shut down after the run, and this process's environment is as it was before.

Checkpoints use the service's layout (``workers.paths``) with ``checkpoint_dir`` as the storage
root and the spec's name as the run id (the CLI's default ``checkpoint_dir`` is
``$TESSERA_HOME/local``, i.e. ``.tessera/local``): running
the same spec again resumes from its newest committed checkpoint, whichever way it was run
before (a one-worker checkpoint reshards onto DDP workers and back). A run already trained to its
end (``finished_local_run``) returns its final metrics at once, without a trainer or a Ray.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Iterator

from pydantic import BaseModel

from api.model_specs import ImportPath
from api.specs import RunSpec, dataset_size
from api.time import TimeUnit
from workers.checkpoint import CheckpointInfo, Checkpointer, normalize_url, storage_for
from workers.loggers import closed_at_end, end_failed_mlflow_runs, end_interrupted_mlflow_runs, with_loggers
from workers.local_ray import (SETUP_HOOK, private_temp_dir, ray_start_uninterrupted, signal_handlers_restored,
                               worker_temp_env)
from workers.outcome import FINAL_SAVED_KEY
from workers.paths import attempts_url, checkpoints_url, default_local_root, export_url, run_url
from workers.reporter import ConsoleReporter, MetricSink
from workers.ray_job import ADDRESS_VARIABLE
from workers.s3_limits import bounded_fs

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
GCS_PORT_VARIABLE = "RAY_GCS_SERVER_PORT"  # read by Ray's head as it starts (ray._private.ray_constants)
# RunSpec fields that move neither the batch a run ends at nor its final model and evaluation: the
# run's name (its folder), where and how it reports and checkpoints, and its parallelism (loaders
# count global batches, the same on any number of workers; checkpoints reshard).
NOT_DECIDING_THE_END = frozenset({"name", "tags", "priority", "loggers", "max_wall_time", "max_restarts", "code",
                                  "checkpoint", "parallelism"})
MAX_EXPORT_HEADER = 64 * 2**20  # bytes; a safetensors header holds names, shapes and metadata, never weights


def default_checkpoint_dir() -> str:
    """``$TESSERA_HOME/local`` as an absolute path (Ray workers run in another folder)."""
    return default_local_root()


def local_run_url(spec: RunSpec, checkpoint_dir: str | None = None) -> str:
    """The folder of ``spec``'s local run: ``{checkpoint_dir}/runs/{spec.name}``."""
    return run_url(checkpoint_dir or default_checkpoint_dir(), spec.name)


def latest_local_checkpoint(spec: RunSpec, checkpoint_dir: str | None = None) -> CheckpointInfo | None:
    """The committed checkpoint a local run of ``spec`` would resume from, if any."""
    return Checkpointer(checkpoints_url(local_run_url(spec, checkpoint_dir)), fingerprint={}).latest_committed()


def train(spec: RunSpec, **kwargs) -> dict[str, float]:
    """``workers.trainer.train``, imported once a run trains in this process: its algorithms import
    torchvision (1.3 s of a 4 s import on 2 cores), which a finished run or a DDP driver never needs."""
    from workers.data.loading import start_worker_server_for

    start_worker_server_for(spec)  # first: the loaders' fork server imports beside the trainer's import and build
    from workers.trainer import train as train_here

    return train_here(spec, **kwargs)


def finished_local_run(spec: RunSpec, checkpoint_dir: str | None = None) -> tuple[int, dict[str, float]] | None:
    """``(step, final metrics)`` of ``spec``'s local run if it is trained to its end, so that a
    resume would train nothing; else None (then the trainer decides, as it resumes).

    Trained to its end: its newest committed checkpoint is at the step of its export, which
    ``Trainer.fit`` writes once it has trained to ``max_duration``, saved and evaluated
    (``{run}/exports/step-{N}``: the checkpoint markers say no more than step and epoch), and the
    export's spec, in its header, differs from ``spec`` only in ``NOT_DECIDING_THE_END``. Such a
    spec ends at the same batch, with the same model and evaluation, where the spec alone fixes that
    batch (``_end_fixed_by_spec``): epochs of data that can grow or shrink under it (an image
    folder) are left to the trainer, which counts them, as is another model, which it refuses, and a
    spec that imports the user's code (``--code DIR``, ``model.import``), which may have changed
    under it. The metrics are what a resume at the end reported: the export's eval metrics and
    ``checkpoint/final_saved`` (the state resumed from is committed): an evaluation set whose files
    changed since (an image folder) is not evaluated again. Reads the checkpoint listing and the
    export's header only."""
    if _imports_code(spec):  # its code may have changed under an unchanged spec: the trainer rebuilds and checks it
        return None
    if not _end_fixed_by_spec(spec):  # its data may have changed under an unchanged spec: the trainer counts it
        return None
    latest = latest_local_checkpoint(spec, checkpoint_dir)
    if latest is None:
        return None
    url = export_url(local_run_url(spec, checkpoint_dir), latest.step, "safetensors")
    try:
        metadata = _safetensors_metadata(url)
        if metadata is None:  # not exported: stopped before the end, or in the final evaluation
            return None
        exported = RunSpec.model_validate_json(metadata["tessera.spec"])
        metrics = {key: float(value) for key, value in json.loads(metadata.get("tessera.metrics", "{}")).items()}
    except Exception as exc:  # a torn or foreign file, a spec this version no longer reads: the trainer decides
        log.info("export %s does not say whether %s is trained to its end (%s: %s)", url, spec.name,
                 type(exc).__name__, exc)
        return None
    if _deciding_the_end(exported) != _deciding_the_end(spec):
        return None
    return latest.step, {**metrics, FINAL_SAVED_KEY: 1.0}


def _imports_code(value: object) -> bool:
    """Whether a spec (or a part of it) names a callable of the user's (``import:`` of a model,
    data set or metric), whose code a local run reads from disk as it is now."""
    if isinstance(value, ImportPath):
        return True
    if isinstance(value, BaseModel):
        return any(_imports_code(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, (list, tuple)):
        return any(_imports_code(item) for item in value)
    if isinstance(value, dict):
        return any(_imports_code(item) for item in value.values())
    return False


def _end_fixed_by_spec(spec: RunSpec) -> bool:
    """Whether ``spec`` alone fixes the batch its run ends at. Batches, samples and tokens do: the
    trainer divides them by the batch size (tokens: times ``seq_len``), both in the spec
    (``workers.timekeeping.to_batches``). Epochs are the training loader's length each, which the
    spec fixes for a built-in data set at its own files (``dataset_size``) and for a webdataset
    (``num_samples // batch_size``), not for an image folder (its files), a built-in set read from
    another ``root``, or the user's own data set (its ``len``): those can grow or shrink under it."""
    if spec.max_duration.unit is not TimeUnit.EPOCH:
        return True
    train = spec.data.train
    return train.name == "webdataset" or dataset_size(train) is not None


def _deciding_the_end(spec: RunSpec) -> dict:
    return {key: value for key, value in spec.model_dump(mode="json").items() if key not in NOT_DECIDING_THE_END}


def _safetensors_metadata(url: str) -> dict[str, str] | None:
    """The ``__metadata__`` of the safetensors file at ``url``, from its header alone (two ranged
    reads, not the weights); None if there is no such file."""
    fs, path = bounded_fs(url)  # S3's bounded waits and tries, as every worker-side read's
    try:
        length = int.from_bytes(fs.cat_file(path, start=0, end=8), "little")
    except FileNotFoundError:
        return None
    if not 0 < length <= MAX_EXPORT_HEADER:
        raise ValueError(f"a header of {length} bytes is no safetensors header")
    return json.loads(fs.cat_file(path, start=8, end=8 + length)).get("__metadata__", {})


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

    A run trained to its end already (``finished_local_run``) is not trained again: its final
    metrics come back at once, through ``sink`` too, with no trainer, no Ray, no logger's run.
    """
    if checkpoint_dir:
        finished = finished_local_run(spec, checkpoint_dir)
        if finished is not None:
            step, metrics = finished
            log.info("%s is trained to its end (batch %d): nothing to train", spec.name, step)
            return _reported(metrics, sink, step=step)
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
            with ray_start_uninterrupted():  # a Ctrl-C or SIGTERM as Ray starts is raised once it has started
                _start_private_ray(spec, temp_dir)
        except BaseException as exc:  # that interrupt, or a failed start: what has started stops before its folder
            ray.shutdown()
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:  # ray.init's handler's sys.exit(15), in a
                raise KeyboardInterrupt from exc  # Ray it could not keep out; another exit stays what it is
            raise
        put_back_handlers()  # SIGTERM's, were ray.init's to get in (a Ray other than 2.60): see ray_start_uninterrupted
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
            # ray.init's SIGTERM handler sys.exit(15) (ray/_private/worker.py:1675-1676) in a process
            # that connected its own Ray (a private Ray gets no such handler). Raised while ray.get
            # waits, Ray's core worker makes it SystemExit(1) whatever the code (hence Ray's own
            # comment there: "for some reason the process still exits with 1"): a Ctrl-C'd tessera
            # train ended with status 1 and no word. Callers get the interrupt they sent, as from an
            # in-process run.
            raise KeyboardInterrupt from exc
        raise
    return _reported(metrics, sink, step=int(metrics.get("time/batch", 0)))


def _reported(metrics: dict[str, float], sink: MetricSink | None, *, step: int) -> dict[str, float]:
    """``metrics``, added to ``sink`` at ``step`` (then closed) if there is one."""
    if sink is not None:
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
