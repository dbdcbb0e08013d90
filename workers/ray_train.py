"""Running a ``RunSpec`` on Ray Train: the only module that touches ``ray.train``.

``fit_with_ray`` builds a ``TorchTrainer`` whose workers each run ``train_loop_per_worker``:
they rebuild everything from the spec (sent as JSON, ``worker_config``) and train one rank
each (``train_rank``), and rank 0 reports to the service (or prints, without one) and returns
its final metrics. Ray's ``TorchConfig`` creates the process group: gloo on CPU, nccl on GPU.
A sweep trial of one worker, or of CPU DDP/FSDP ranks, calls ``train_rank`` in its Tune actor
(and peer actors), without Ray Train (``workers.tune.actor_ranks``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from api.client import Client
from api.process_logging import quiet_http_clients
from api.lineage import ForkInfo
from api.specs import RunSpec
from workers.errors import TrainingError, describe
from workers.paths import attempt_marker_url, checkpoints_url, default_ray_storage_path, run_url

if TYPE_CHECKING:
    from workers.reporter import MetricSink

log = logging.getLogger(__name__)

# The job driver imports this module only to start the TorchTrainer: what the workers need
# (the trainer, models, checkpoints, algorithms) is imported inside ``train_rank``,
# so the driver does not load torchvision and torch.distributed.checkpoint (bench/startup.py).

# The driver's variables every Ray Train worker gets: test hooks, and how reports wait out outages.
WORKER_ENV_PREFIXES = ("TESSERA_TEST_", "TESSERA_REPORT_", "TESSERA_SPOOL_")
# Ray Train's controller learns that the workers are done by polling them, every 2 s by default
# (DEFAULT_HEALTH_CHECK_INTERVAL_S, ray/train/v2/_internal/constants.py in Ray 2.x); fit() returns,
# and the run is reported COMPLETED, only after that poll. The controller reads the interval when
# it is built, from the driver's RAY_TRAIN_* variables that Ray Train hands it
# (get_env_vars_to_propagate). Each poll is one actor call per worker. bench/fit_end.py measures it.
CONTROLLER_POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
CONTROLLER_POLL_INTERVAL_S = 0.25


def fit_with_ray(spec: RunSpec, *, run_id: str, service_url: str | None = None, token: str | None = None,
                 storage_path: str | None = None, storage_url: str | None = None,
                 attempt: int = 1, tune: bool = False, fork: ForkInfo | None = None,
                 trial: dict[str, str] | None = None, tune_metric: str | None = None) -> dict[str, float]:
    """Train ``spec`` on ``spec.parallelism.num_workers`` Ray Train workers; returns rank 0's
    final metrics. Needs a connected Ray (``ray.init``).

    With ``service_url`` and ``token``, rank 0 reports status and metrics to the service;
    otherwise it prints progress. With ``storage_url`` (``file://``/``s3://``), checkpoints go to
    the run's folder (``workers.paths.checkpoints_url``) and the run resumes from the newest committed
    one; a worker-group restart by Ray Train (``max_restarts``) resumes the same way and is
    reported as RESTARTING, then RUNNING. Raises ``TrainingError("Type: message")`` carrying the root
    cause when any worker fails (after ``spec.max_restarts`` restarts).

    ``tune=True`` (inside a Ray Tune function trainable, see ``workers.tune``): every worker
    reports each evaluation with ``ray.train.report`` and ``TuneReportCallback`` forwards rank 0's
    to Tune's scheduler; a worker group that cannot start fails the trial at once
    (``controller_failure_limit=0``) so that Tune can retry it instead of waiting forever.

    ``fork`` (``RunView.fork``): a forked run without a checkpoint of its own starts from the
    parent's checkpoint named there. ``trial``, ``tune_metric``: a sweep trial's ids and the
    metric its sweep decides on (``worker_config``).
    """
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    parallelism = spec.parallelism
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=worker_config(spec, run_id=run_id, service_url=service_url, token=token,
                                        storage_url=storage_url, attempt=attempt, tune=tune, fork=fork,
                                        trial=trial, tune_metric=tune_metric),
        scaling_config=ScalingConfig(num_workers=parallelism.num_workers, use_gpu=parallelism.use_gpu,
                                     resources_per_worker={"CPU": parallelism.cpus_per_worker}),
        run_config=_run_config(spec, run_id, storage_path, tune=tune),
        torch_config=TorchConfig(backend="nccl" if parallelism.use_gpu else "gloo"),
    )
    try:
        with _controller_polls_often():
            result = trainer.fit()
    except Exception as exc:
        message = describe(exc)
        log.error("run %s failed: %s", run_id, message)
        raise TrainingError(message) from exc
    return dict(result.return_value or {})


@contextlib.contextmanager
def _controller_polls_often() -> Iterator[None]:
    """``CONTROLLER_POLL_INTERVAL_S`` for the controller a ``fit()`` in this block starts, unless
    the environment sets an interval; the process's environment as it was afterwards, whether
    ``fit()`` returned or raised. Ray Train also hands the variable on to the workers' runtime
    env. One fit at a time per process (a job driver, a Tune trial's actor): the variable is the
    process's, so a second fit in another thread could see it removed and poll every 2 s."""
    if CONTROLLER_POLL_ENV in os.environ:
        yield
        return
    os.environ[CONTROLLER_POLL_ENV] = repr(CONTROLLER_POLL_INTERVAL_S)
    try:
        yield
    finally:
        os.environ.pop(CONTROLLER_POLL_ENV, None)


def forwarded_env() -> dict[str, str]:
    """This process's variables that start with ``WORKER_ENV_PREFIXES``, for the ranks it starts."""
    return {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV_PREFIXES)}


def worker_config(spec: RunSpec, *, run_id: str, service_url: str | None = None, token: str | None = None,
                  storage_url: str | None = None, attempt: int = 1, tune: bool = False,
                  fork: ForkInfo | None = None, trial: dict[str, str] | None = None,
                  tune_metric: str | None = None) -> dict[str, Any]:
    """What every rank gets (``train_rank``'s ``config``): plain JSON-able values, since Ray
    pickles it to each worker. Test hooks (e.g. TESSERA_TEST_KILL_AT_BATCH) and the report
    patience and spool settings travel in it, whether the driver is a Ray job or a test process.
    ``trial`` (``{"sweep_id": ..., "trial_id": ...}``): a sweep trial's, for rank 0's loggers
    (``workers.loggers.MLflowSink``: a stopped trial's MLflow run is left to the sweep driver).
    ``tune_metric``: the key the sweep decides on, which every evaluation must report
    (``train_rank``)."""
    return {"spec": spec.model_dump_json(), "run_id": run_id, "attempt": attempt,
            "run_url": run_url(storage_url, run_id) if storage_url else None,
            "test_env": forwarded_env(),
            "service_url": service_url, "token": token, "tune": tune,
            "fork": fork.model_dump(mode="json") if fork is not None else None,
            "storage_url": storage_url,  # where workers fetch the run's code package
            "trial": trial, "tune_metric": tune_metric}


def _run_config(spec: RunSpec, run_id: str, storage_path: str | None, *, tune: bool) -> Any:
    """Ray Train's ``RunConfig``: restarts, storage (v2 needs a path), and Tune's reporting."""
    from ray.train import FailureConfig, RunConfig

    callbacks, failure = [], FailureConfig(max_failures=spec.max_restarts)
    if tune:
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks = [TuneReportCallback()]
        failure = FailureConfig(max_failures=spec.max_restarts, controller_failure_limit=0)
    storage_path = storage_path or default_ray_storage_path()
    if "://" not in storage_path:
        storage_path = os.path.abspath(storage_path)  # workers run in Ray's session folder
    return RunConfig(name=f"tessera-{run_id}", storage_path=storage_path, failure_config=failure, callbacks=callbacks)


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, float] | None:
    """One Ray Train worker: its rank and device from Ray Train, then ``train_rank``."""
    entered = time.time()
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    return train_rank(config, rank=context.get_world_rank(), world_size=context.get_world_size(),
                      device_for=lambda use_gpu: ray.train.torch.get_device() if use_gpu else torch.device("cpu"),
                      on_eval=_report_to_tune if config.get("tune") else None, entered=entered)


def train_rank(config: dict[str, Any], *, rank: int, world_size: int, device_for: Callable[[bool], torch.device],
               on_eval: Callable[[dict[str, float]], None] | None, entered: float) -> dict[str, float] | None:
    """One rank of a run (``config`` from ``worker_config``): build from the spec, report
    RUNNING (rank 0), train; rank 0 returns the final metrics. ``device_for(use_gpu)``: this
    rank's device. A Ray Train worker calls it, and so do the ranks of a sweep trial that trains
    in its own Tune actor (``workers.tune.actor_ranks``)."""
    from workers.data.loading import start_worker_server_for

    spec = RunSpec.model_validate_json(config["spec"])
    start_worker_server_for(spec)  # first: its imports run beside this rank's and its build
    from api.views import RunStatus
    from workers.fault_injection import install_fault_injection
    from workers.loggers import closed_at_end, with_loggers
    from workers.models.user_code import install_code
    from workers.reporter import NullSink
    from workers.surgery_notes import with_notes
    from workers.trainer import Trainer, process_settings

    quiet_http_clients()  # rank 0's metric reports: a line each in the run's log otherwise

    imported = time.time()
    device = device_for(spec.parallelism.use_gpu)
    os.environ.update(config.get("test_env") or {})
    _record_rank_process(config.get("run_id"), rank)
    run = config.get("run_url")
    sink = (with_loggers(_sink_for(config), spec, run, run_id=config.get("run_id"), trial=config.get("trial"),
                         attempt=config.get("attempt", 1), service_run=_reports_to_service(config))
            if rank == 0 else NullSink())
    # Closes the sink however the attempt ends; rank 0's loggers end their runs with that outcome.
    with closed_at_end(sink):
        restarted = rank == 0 and run is not None and _is_restart(run, config.get("attempt", 1))
        if spec.code is not None:  # before the model is built: it imports from the package
            install_code(spec.code, storage_url=config.get("storage_url"))
        with process_settings(spec):
            fork = ForkInfo.model_validate(config["fork"]) if config.get("fork") else None
            if on_eval is not None and config.get("tune_metric"):
                on_eval = requiring(config["tune_metric"], on_eval)
            trainer = Trainer(spec, sink=sink, device=device, checkpoint_url=checkpoints_url(run) if run else None,
                              on_eval=on_eval, fork=fork)
            install_fault_injection(trainer)  # only when a test asks for it (TESSERA_TEST_*)
            message = with_notes(f"training on {world_size} worker(s), {device.type}", trainer.surgery_notes)
            latest = trainer.checkpointer.latest_committed() if rank == 0 and trainer.checkpointer else None
            if latest is not None:
                message += f"; resuming from {latest.url}"
            elif fork is not None and fork.checkpoint_url is not None:
                message += f"; starting from the parent's checkpoint {fork.checkpoint_url}"
            if restarted:
                sink.status(RunStatus.RESTARTING, message="Ray Train restarted the worker group")
            # The step it starts from: what earlier attempts reported after it is superseded.
            sink.status(RunStatus.RUNNING, message=message, step=latest.step if latest is not None else 0)
            built = time.time()
            first_step = FirstStepClock(trainer.engine) if rank == 0 else None
            try:
                metrics = trainer.fit()
            except BaseException as exc:
                # A failure may be this rank's alone, with peers inside a collective: whoever
                # started the ranks drops their group. A stop (SystemExit, TrialStopped) came
                # to every rank at one evaluation (workers.tune.actor_ranks): close as at the end.
                if not isinstance(exc, Exception):
                    _close_after_stop(trainer, "trainer")
                raise
            trainer.close()
    if rank == 0:
        phases = {"worker_entered": entered, "worker_imported": imported, "trainer_built": built}
        if first_step.done is not None:  # a run resumed at its end takes no step
            phases["first_step_done"] = first_step.done
        _record_startup({**phases, "fit_returned": time.time()})
    return metrics if rank == 0 else None


def _close_after_stop(closeable: Any, what: str) -> None:
    """``closeable.close()`` on the way out of a stopped trial: an error there is logged, not
    raised, so that the stop stays what ends the trial (a stopped trial is not trained again)."""
    try:
        closeable.close()
    except Exception as exc:
        log.warning("closing the stopped trial's %s failed: %s", what, describe(exc))


class FirstStepClock:
    """An engine callback: when the trainer's first step ends (``done``, Unix seconds; on CUDA
    its kernels may still run). Start-up ends there: ``fit`` of a one-batch run goes on to end
    the run (final checkpoint, evaluation, export), which a baseline that takes one step
    (``bench/startup.py``) does not do. It takes itself off the engine at that first
    ``BATCH_END``, so later steps pay nothing."""

    def __init__(self, engine: Any):
        self.engine, self.done = engine, None
        engine.callbacks.append(self)

    def run_event(self, event: Any, state: Any) -> None:
        from workers.events import Event

        if event == Event.BATCH_END:
            self.done = time.time()
            # A new list: the engine is iterating the old one.
            self.engine.callbacks = [c for c in self.engine.callbacks if c is not self]


def _record_startup(phases: dict[str, float]) -> None:
    """Rank 0's start-up phases into the worker log, as seconds since the first
    (``start-up: worker_imported +3.46 s, trainer_built +5.33 s, ...``), and their timestamps
    (Unix seconds) into the file ``TESSERA_TEST_STARTUP_FILE`` names when set
    (``bench/startup.py``): five clock reads per run, nothing per step after the first."""
    first = min(phases.values(), default=0.0)
    log.info("start-up: %s", ", ".join(f"{name} +{at - first:.2f} s" for name, at in phases.items() if at != first)
             or "one phase")
    path = os.environ.get("TESSERA_TEST_STARTUP_FILE")
    if path:
        with open(path, "w") as file:
            json.dump(phases, file)


def _record_rank_process(run_id: str | None, rank: int) -> None:
    """Which process trains each rank, as an empty file ``{run_id}.rank{rank}.pid{pid}`` in the
    folder ``TESSERA_TEST_RANKS_DIR`` names, when set (tests that check which processes a sweep's
    trials reuse, ``workers.tune.actor_ranks``)."""
    folder = os.environ.get("TESSERA_TEST_RANKS_DIR")
    if folder:
        open(os.path.join(folder, f"{run_id}.rank{rank}.pid{os.getpid()}"), "w").close()


def requiring(metric: str, on_eval: Callable[[dict[str, float]], None]) -> Callable[[dict[str, float]], None]:
    """``on_eval`` of a sweep trial, which first checks that the evaluation reported ``metric``,
    the key its sweep decides on: Tune fails the whole sweep on a result without it when its
    scheduler (ASHA) reads it, and a FIFO sweep would end with no best trial and no word why. A
    metric of your own that returned other names fails the trial naming what it did report.
    Every rank gets the same results, so every rank raises alike."""
    from workers.models.code_cache import UserCodeError

    def checked(results: dict[str, float]) -> None:
        if metric not in results:
            reported = ", ".join(sorted(key for key in results if key.startswith("eval/")))
            raise UserCodeError(f"metric: the sweep decides on {metric}, but this evaluation reported {reported}; "
                                "name the key your eval_metrics callable returns in the sweep's metric")
        on_eval(results)

    return checked


def _report_to_tune(results: dict[str, float]) -> None:
    """Every rank reports (Ray Train waits for all of them); Tune gets rank 0's copy."""
    import ray.train

    ray.train.report(dict(results))


def _is_restart(run: str, attempt: int) -> bool:
    """Whether this job attempt already started the train function once: Ray Train v2 re-runs
    it on a worker-group restart. Rank 0 leaves a marker the first time."""
    from workers.checkpoint import storage_for

    storage = storage_for(run)
    marker = attempt_marker_url(run, attempt)
    if storage.isfile(marker):
        return True
    storage.write_bytes(marker, b"")
    return False


def _reports_to_service(config: dict[str, Any]) -> bool:
    """Whether this run reports to the service (whose run ids name one run alone)."""
    return bool(config.get("service_url") and config.get("token"))


def _sink_for(config: dict[str, Any]) -> "MetricSink":
    from api.client import Client
    from workers.reporter import ConsoleReporter, ServiceReporter

    if _reports_to_service(config):
        # The attempt token, never a user key: worker processes run user code.
        return ServiceReporter(Client(config["service_url"], api_key=config["token"]), config["run_id"],
                               config["token"])
    return ConsoleReporter(prefix=f"[{config['run_id']}] ")
