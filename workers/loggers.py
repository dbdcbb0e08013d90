"""Experiment loggers as ``MetricSink``s, composed with the run's own sink on rank 0.

``with_loggers(sink, spec, run)`` returns ``sink`` alone when the spec has no ``loggers``, else a
``FanoutSink`` that sends everything to ``sink`` first and then to each logger. A logger's
failure (an MLflow server down, a full disk) is logged and never fails the run: Tessera's own
store is the record; the loggers are copies.

* ``TensorBoardSink`` writes event files to a local folder and copies them to
  ``{run}/tensorboard/`` (``workers.paths.tensorboard_url``) on every flush and at close, so
  they land under the run's storage prefix on ``file://`` and ``s3://`` alike.
* ``MLflowSink`` logs to an MLflow tracking server: a run in the spec's experiment, tagged with
  the Tessera run id and the spec's tags, with the flattened spec as params, metrics batched
  per flush, and ended with the attempt's outcome.

How an attempt ended reaches the loggers in the process that trains rank 0, and only there:
``closed_at_end(sink)`` wraps the attempt, both in ``tessera train``'s in-process run
(``workers.local``) and in every rank 0 of ``workers.ray_train.train_rank`` (Ray Train workers,
sweep trials), and ends the loggers' runs with ``ended_as`` its outcome (MLflow: ``MLFLOW_STATUS``).
The service hears the outcome from the process that started the ranks
(``workers.outcome.RunOutcome``), which holds no loggers; so the loggers get the outcome as a
status and the primary sink does not.

An MLflow run that rank 0 cannot end is ended, while it is still RUNNING, by the process that
outlives rank 0 and knows how the attempt ended, with one function, ``end_running_mlflow_runs``
(which finds the runs by their tags: ``RUN_ID_TAG``, ``SWEEP_ID_TAG``, ``TRIAL_ID_TAG``):

* a canceled run: the service stops its Ray job, which kills the Ray Train workers, rank 0
  before it ends its run; the job's driver ends the run's RUNNING ones KILLED as it is stopped
  (``end_interrupted_mlflow_runs``, called by ``workers.launch``);
* a sweep trial: Tune stops a trial (its scheduler, the sweep's time budget, a cancel) by
  raising ``SystemExit`` in it at its next report, or by ending its actor, and rank 0 cannot
  tell a scheduler's stop from a cancel; so a trial's rank 0 leaves its run RUNNING on a stop
  and the sweep driver, which knows, ends it (``workers.tune.reporting``).

After a SIGKILL of rank 0, of the job or of the sweep driver, or a lost node, a run of the
service has them ended FAILED by its next start (``MLflowSink.end_left_running``): a restart of
the worker group (Ray Train's, within ``max_restarts``) or the service's next attempt. When the
worker group fails for good, the job's driver ends them FAILED (``end_failed_mlflow_runs``,
called by ``workers.launch``). What a SIGKILLed driver on the last attempt leaves, and what a
killed ``tessera train`` leaves (its run ids are spec names, not unique), stays RUNNING.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Collection, Iterator

from api.specs import RunSpec
from api.views import RunStatus
from workers.errors import describe
from workers.paths import tensorboard_url
from workers.reporter import MetricSink

log = logging.getLogger(__name__)

# The tags that name the Tessera run an MLflow run belongs to (``MLflowSink``) and, for a sweep
# trial, its sweep (the sweep's id; a fresh key for a sweep without a service) and trial, by which
# ``end_running_mlflow_runs`` finds them; and the Tessera status a run was ended with.
RUN_ID_TAG = "tessera.run_id"
SWEEP_ID_TAG = "tessera.sweep_id"
TRIAL_ID_TAG = "tessera.trial_id"
STATUS_TAG = "tessera.status"
LEFT_RUNNING_TIMEOUT_S = 10.0  # how long rank 0 waits, as it starts, on ending what earlier starts left RUNNING

# How an attempt's end reads in MLflow, whoever ends its run. STOPPED is a sweep trial that its
# scheduler (ASHA) or the sweep's time budget ended early: a normal outcome of a sweep, neither a
# failure nor a user's kill, so FINISHED (as Ray Tune's own MLflowLoggerCallback ends such a
# trial; MLflow's KILLED would read as canceled, and a sweep of 16 trials would show 12 killed).
# ``STATUS_TAG`` (STOPPED) and the last ``time/progress`` (< 1) tell it from a trial that trained
# to its end. A canceled run or sweep (CANCELED) is KILLED.
MLFLOW_STATUS = {RunStatus.COMPLETED: "FINISHED", RunStatus.FAILED: "FAILED", RunStatus.CANCELED: "KILLED",
                 RunStatus.STOPPED: "FINISHED"}


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """``{"optimizer.lr": "0.1", "algorithms.0.name": "blurpool", ...}``: a spec as flat params."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: str(value)}
    flat: dict[str, str] = {}
    for key, inner in items:
        flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
    return flat


class FanoutSink:
    """A ``MetricSink`` that forwards every call to ``primary``, then to each of ``extras``
    (whose errors are logged, not raised)."""

    def __init__(self, primary: MetricSink, extras: list[MetricSink]):
        self.primary, self.extras = primary, extras

    def _each(self, method: str, *args: Any, **kwargs: Any) -> None:
        getattr(self.primary, method)(*args, **kwargs)
        self._extras(method, *args, **kwargs)

    def add(self, step: int, key: str, value: float) -> None:
        self._each("add", step, key, value)

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        self._each("status", status, error=error, message=message, step=step)

    def checkpoint(self, report: dict[str, Any]) -> None:
        self._each("checkpoint", report)

    def note(self, message: str) -> None:
        self._each("note", message)

    def flush(self) -> None:
        self._each("flush")

    def deliver(self, timeout_s: float) -> bool:
        """The primary's delivery: the loggers write as they are flushed."""
        return self.primary.deliver(timeout_s)

    def close(self) -> None:
        """Close every sink, the loggers also when the primary fails to close; the loggers' runs
        stay open (``end``, ``closed_at_end`` end them)."""
        try:
            self.primary.close()
        finally:
            self._extras("close")

    def end(self, exc: BaseException | None) -> None:
        """``close`` at the end of an attempt that ended with ``exc`` (None: trained to its end):
        the primary first; then each logger gets the outcome (``ended_as``) as a status and is
        closed. If the primary cannot close after a clean end (its reports are undeliverable:
        the run fails), the loggers end FAILED with that, and it is raised."""
        try:
            self.primary.close()
        except BaseException as failure:
            exc = exc if exc is not None else failure
            raise
        finally:
            status, error = ended_as(exc)
            self._extras("status", status, error=error)
            self._extras("close")

    def _extras(self, method: str, *args: Any, **kwargs: Any) -> None:
        for extra in self.extras:
            try:
                getattr(extra, method)(*args, **kwargs)
            except Exception:
                log.warning("logger %s failed in %s; the run goes on", type(extra).__name__, method, exc_info=True)


def ended_as(exc: BaseException | None) -> tuple[RunStatus, str | None]:
    """How an attempt that ended with ``exc`` ends its loggers' runs, and the error:
    COMPLETED (None: trained to its end), FAILED with the root cause as ``"Type: message"`` (an
    ``Exception``), CANCELED (``KeyboardInterrupt``: ``tessera train`` interrupted), STOPPED (any
    other ``BaseException``: Tune stopped a sweep trial with ``SystemExit`` or ``TrialStopped``)."""
    if exc is None:
        return RunStatus.COMPLETED, None
    if isinstance(exc, KeyboardInterrupt):
        return RunStatus.CANCELED, "interrupted"
    if not isinstance(exc, Exception):
        return RunStatus.STOPPED, None
    return RunStatus.FAILED, describe(exc)


@contextlib.contextmanager
def closed_at_end(sink: MetricSink) -> Iterator[MetricSink]:
    """Close rank 0's ``sink`` when the attempt in the block ends, and end its loggers' runs with
    how the block ended (``ended_as``; see the module docstring). A sink without loggers is just
    closed. After a block that raised an ``Exception``, a failure to close is raised as ever;
    after a stop (any other ``BaseException``) it is logged, so that the stop stays what ends
    the attempt (a stopped sweep trial is not trained again)."""
    try:
        yield sink
    except BaseException as exc:
        if isinstance(exc, Exception):
            _end(sink, exc)
            raise
        try:
            _end(sink, exc)
        except Exception as failure:
            log.warning("closing the reporter after a stop failed: %s", describe(failure))
        raise
    _end(sink, None)


def _end(sink: MetricSink, exc: BaseException | None) -> None:
    if isinstance(sink, FanoutSink):
        sink.end(exc)
    else:
        sink.close()


class TensorBoardSink:
    """Scalars (and the spec as text) in TensorBoard event files under ``{run}/tensorboard/``."""

    def __init__(self, spec: RunSpec, run: str):
        from torch.utils.tensorboard import SummaryWriter

        self.target = tensorboard_url(run)
        self.local = tempfile.mkdtemp(prefix="tessera-tb-")
        self.writer = SummaryWriter(log_dir=self.local)
        self._uploaded: dict[str, int] = {}  # file name -> size last copied
        self.writer.add_text("spec", f"```\n{spec.model_dump_json(indent=2)}\n```")
        if spec.tags:
            self.writer.add_text("tags", ", ".join(spec.tags))

    def add(self, step: int, key: str, value: float) -> None:
        self.writer.add_scalar(key, value, step)

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        """TensorBoard has scalars only: statuses stay in Tessera's own store."""

    def checkpoint(self, report: dict[str, Any]) -> None:
        """Checkpoints stay in Tessera's own store."""

    def note(self, message: str) -> None:
        """Notes are run events in Tessera."""

    def flush(self) -> None:
        self.writer.flush()
        self._upload()

    def deliver(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        """Write the last events and copy them; then the local folder goes (kept if the copy
        failed)."""
        self.writer.close()
        self._upload()
        shutil.rmtree(self.local, ignore_errors=True)

    def _upload(self) -> None:
        """Copy the event files that grew since the last copy (scalar events are small: the
        trainer flushes at epoch ends and evaluations, not per step)."""
        # Here, not at the top: the job driver imports this module (end_interrupted_mlflow_runs)
        # and must not load the checkpointing package (test_errors_and_launch).
        from workers.checkpoint.storage import join, storage_for

        storage = storage_for(self.target)
        for name in sorted(os.listdir(self.local)):
            path = os.path.join(self.local, name)
            if self._uploaded.get(name) == os.path.getsize(path):
                continue
            with open(path, "rb") as file:
                data = file.read()
            storage.write_bytes(join(self.target, name), data)
            self._uploaded[name] = len(data)


class MLflowSink:
    """One MLflow run per Tessera run attempt (per worker-group start under Ray Train): params,
    tags, batched metrics, and the outcome: a terminal ``status`` ends the run (``closed_at_end``
    sends it); ``close`` alone leaves it RUNNING, since it does not know how the attempt ended.

    ``trial`` (``{"sweep_id": ..., "trial_id": ...}``): this is a sweep trial's rank 0; the run is
    tagged with both, and a stop (STOPPED: Tune raised ``SystemExit``) leaves it RUNNING for the
    sweep's driver to end, since only the driver knows whether the scheduler stopped the trial
    (FINISHED) or the sweep was canceled (KILLED). Outside a sweep a stop (a ``SystemExit``) is
    an interruption: KILLED. A run that already ended (the sweep's driver ended it on a cancel
    while this rank still trained) is left as it ended.

    For a run of the service (``service_run``: its ``run_id`` names it alone), a later start of
    it (``attempt`` > 1, or a ``RESTARTING`` status: Ray Train restarted the worker group) ends
    FAILED the MLflow runs an earlier start left RUNNING when its rank 0 died
    (``end_left_running``). Not for other runs: ``tessera train`` names its runs by the spec's
    name, which another live run, on another machine, may share."""

    def __init__(self, spec: RunSpec, tracking_uri: str, experiment: str, *, run_id: str | None = None,
                 trial: dict[str, str] | None = None, attempt: int = 1, service_run: bool = False):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri, self.experiment, self.tessera_run_id = tracking_uri, experiment, run_id
        self.service_run = service_run and bool(run_id)
        self.trial = trial
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        tags = {RUN_ID_TAG: run_id or "", "mlflow.runName": spec.name} | {f"tag.{t}": "true" for t in spec.tags}
        if trial is not None:
            tags |= {SWEEP_ID_TAG: trial["sweep_id"], TRIAL_ID_TAG: trial["trial_id"]}
        self.run_id = self.client.create_run(experiment_id, tags=tags, run_name=spec.name).info.run_id
        from mlflow.entities import Metric, Param

        params = [Param(k, v[:6000]) for k, v in flatten(spec.model_dump(mode="json")).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])
        self.pending: list[Any] = []
        self._metric = Metric
        if self.service_run and attempt > 1:
            self.end_left_running()

    def end_left_running(self, timeout_s: float = LEFT_RUNNING_TIMEOUT_S) -> threading.Thread | None:
        """End FAILED this service run's MLflow runs, other than this one, that are still
        RUNNING: an earlier attempt's or worker group's, whose rank 0 died (a SIGKILL, a lost
        node) before it could end its run. As ``end_running_mlflow_runs`` does, in a daemon
        thread waited for ``timeout_s`` at most (a tracking server that does not answer would hold
        rank 0, and every rank with it, for MLflow's retries); logged, never raised. The thread."""
        return _end_in_background([(self.tracking_uri, self.experiment)], {RUN_ID_TAG: self.tessera_run_id},
                                  RunStatus.FAILED, timeout_s=timeout_s, keep={self.run_id})[0]

    def add(self, step: int, key: str, value: float) -> None:
        self.pending.append(self._metric(key, float(value), int(time.time() * 1000), int(step)))

    def status(self, status: RunStatus, *, error: str | None = None, message: str | None = None,
               step: int | None = None) -> None:
        if status is RunStatus.RESTARTING and self.service_run:
            self.end_left_running()
        if status not in MLFLOW_STATUS:
            return
        self.flush()  # MLflow takes metrics for a run that ended, too
        if status is RunStatus.STOPPED:
            if self.trial is not None:
                return  # the sweep's driver ends it (see the class docstring)
            status = RunStatus.CANCELED
        if self.client.get_run(self.run_id).info.status != "RUNNING":
            log.info("MLflow run %s already ended; left as it is", self.run_id)
            return
        end_mlflow_run(self.client, self.run_id, status)

    def checkpoint(self, report: dict[str, Any]) -> None:
        """Checkpoints stay in Tessera's own store (MLflow would copy their bytes as artifacts)."""

    def note(self, message: str) -> None:
        """Notes are run events in Tessera."""

    def flush(self) -> None:
        while self.pending:  # at most 1000 metrics per batch
            batch, self.pending = self.pending[:1000], self.pending[1000:]
            self.client.log_batch(self.run_id, metrics=batch)

    def deliver(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.flush()


def end_mlflow_run(client: Any, mlflow_run_id: str, status: RunStatus) -> None:
    """End one MLflow run as a Tessera attempt that ended ``status`` (``MLFLOW_STATUS``), and tag
    it with the status (``STATUS_TAG``): by rank 0 (``MLflowSink``) and by whoever ends the runs
    rank 0 could not (``end_running_mlflow_runs``)."""
    client.set_terminated(mlflow_run_id, MLFLOW_STATUS[status])
    client.set_tag(mlflow_run_id, STATUS_TAG, status.value)


def with_loggers(sink: MetricSink, spec: RunSpec, run: str | None, *, run_id: str | None = None,
                 trial: dict[str, str] | None = None, attempt: int = 1, service_run: bool = False) -> MetricSink:
    """``sink`` plus the spec's loggers (rank 0 only). A logger that cannot start is logged and
    left out; TensorBoard needs the run folder ``run``; ``trial``: a sweep trial's ids,
    ``attempt``: the job attempt, ``service_run``: ``run_id`` is the service's (``MLflowSink``)."""
    extras: list[MetricSink] = []
    for logger in spec.loggers:
        try:
            if logger.name == "tensorboard":
                if run is None:
                    log.warning("tensorboard logger: this run has no storage folder; not writing event files")
                    continue
                extras.append(TensorBoardSink(spec, run))
            else:
                extras.append(MLflowSink(spec, logger.tracking_uri, logger.experiment, run_id=run_id,
                                          trial=trial, attempt=attempt, service_run=service_run))
        except Exception:
            log.warning("logger %s could not start; the run goes on without it", logger.name, exc_info=True)
    return FanoutSink(sink, extras) if extras else sink


def mlflow_targets(spec: RunSpec) -> list[tuple[str, str]]:
    """``(tracking_uri, experiment)`` of each of ``spec``'s MLflow loggers."""
    return [(logger.tracking_uri, logger.experiment) for logger in spec.loggers if logger.name == "mlflow"]


def prepare_mlflow_end(spec: RunSpec) -> threading.Thread | None:
    """Get ready, in a daemon thread, for ``end_running_mlflow_runs``: import MLflow, make a
    client for each of ``spec``'s tracking servers and ask each for its experiment (the HTTP
    session's first connection). For a job driver (a run's, a sweep's) as it starts: a stop then
    spends its seconds on the runs themselves (unprepared, a stopped driver on a busy 2-core node
    did not get through the import and its first requests in its 2 s; prepared, ending took
    0.1-0.4 s there). Failures are logged at debug level (the stop tries again); nothing is
    raised. The thread, or None without an MLflow logger."""
    targets = mlflow_targets(spec)
    if not targets:
        return None

    def prepare() -> None:
        for tracking_uri, experiment in targets:
            try:
                _mlflow_client(tracking_uri).get_experiment_by_name(experiment)
            except Exception as exc:
                log.debug("preparing to end MLflow runs at %s failed: %s", tracking_uri, describe(exc))

    thread = threading.Thread(target=prepare, name="prepare-mlflow-end", daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # no new threads: the stop does it all, if it can
        log.debug("could not prepare to end MLflow runs: %s", describe(exc))
        return None
    return thread


def end_interrupted_mlflow_runs(spec: RunSpec, run_id: str, *, timeout_s: float = 2.0,
                                started_after_ms: int | None = None) -> list[str] | None:
    """End as KILLED (CANCELED) the MLflow runs of Tessera run ``run_id`` that are still RUNNING
    (``end_running_mlflow_runs``). For the process that started the ranks, when it is stopped
    (``workers.launch``: the service canceled the run and Ray stops its job): the ranks are
    killed after it, so rank 0 never ends its MLflow run (``closed_at_end``). Every RUNNING one
    of the run goes, also one an earlier attempt's killed ranks left."""
    return end_running_mlflow_runs(spec, {RUN_ID_TAG: run_id}, RunStatus.CANCELED, timeout_s=timeout_s,
                                   started_after_ms=started_after_ms)


def end_failed_mlflow_runs(spec: RunSpec, run_id: str, *, timeout_s: float = LEFT_RUNNING_TIMEOUT_S,
                           started_after_ms: int | None = None) -> list[str] | None:
    """End as FAILED the MLflow runs of Tessera run ``run_id`` that are still RUNNING
    (``end_running_mlflow_runs``). For the process that started the ranks, when training failed
    (``workers.launch``): Ray Train has stopped the worker group by then, so no rank is left to
    end one. A rank 0 that raised ended its own run FAILED; one SIGKILLed (out of memory, say) or
    lost with its node left it RUNNING, on this start or an earlier one of the worker group."""
    return end_running_mlflow_runs(spec, {RUN_ID_TAG: run_id}, RunStatus.FAILED, timeout_s=timeout_s,
                                   started_after_ms=started_after_ms)


def end_running_mlflow_runs(spec: RunSpec, tags: dict[str, str], status: RunStatus, *,
                            timeout_s: float = 2.0, started_after_ms: int | None = None) -> list[str] | None:
    """End the MLflow runs that carry every one of ``tags`` and are still RUNNING, in the
    experiment of each of ``spec``'s MLflow loggers, as attempts that ended ``status``
    (``end_mlflow_run``); the ids of those it ended. For whoever outlives a rank 0 that could
    not end its run (see the module docstring): the job driver of a canceled run
    (``end_interrupted_mlflow_runs``), the sweep driver for its trials
    (``workers.tune.reporting``). Runs that ended (FINISHED, FAILED, KILLED) are left as they are.

    Bounded and quiet, as a stop needs: the work runs in a daemon thread that gets ``timeout_s``
    (an unreachable tracking server would otherwise have MLflow's client retry for minutes), and
    the runs it ended by then are returned; None if it did not finish in time (the thread is
    left to run on, or to the process's exit). A failure is logged, never raised. ``[]`` at once
    for a spec without an MLflow logger. ``prepare_mlflow_end`` at the start makes it faster.
    ``started_after_ms``: only runs started then or later (epoch milliseconds), for a caller
    whose run id another process may share (``tessera train`` of one spec, twice at once)."""
    return _end_in_background(mlflow_targets(spec), tags, status, timeout_s=timeout_s,
                              started_after_ms=started_after_ms)[1]


def _end_in_background(targets: list[tuple[str, str]], tags: dict[str, str], status: RunStatus, *,
                       timeout_s: float, keep: Collection[str] = (),
                       started_after_ms: int | None = None) -> tuple[threading.Thread | None, list[str] | None]:
    """``end_running_mlflow_runs`` on ``targets`` (``(tracking_uri, experiment)`` pairs), leaving
    the MLflow runs in ``keep`` running: its daemon thread (None if none was started) and the runs
    it ended within ``timeout_s`` (None if it did not finish by then, or could not start)."""
    if not targets:
        return None, []
    what = ", ".join(f"{key}={value}" for key, value in tags.items())
    ended: list[str] = []
    done = threading.Event()

    def end_all() -> None:
        try:
            for tracking_uri, experiment in targets:
                try:
                    ended.extend(_end_running_mlflow_runs(tracking_uri, experiment, tags, status, keep=keep,
                                                          started_after_ms=started_after_ms))
                except Exception as exc:
                    log.warning("could not end the MLflow runs of %s in experiment %s at %s: %s",
                                what, experiment, tracking_uri, describe(exc))
        finally:
            done.set()

    started = time.monotonic()
    thread = threading.Thread(target=end_all, name="end-mlflow-runs", daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # no new threads (the interpreter is shutting down)
        log.warning("could not end the MLflow runs of %s: %s", what, describe(exc))
        return None, None
    if not done.wait(timeout_s):
        log.warning("ending the MLflow runs of %s did not finish within %gs (ended so far: %s); "
                    "the others stay RUNNING", what, timeout_s, ", ".join(ended) or "none")
        return thread, None
    log.info("ended %d MLflow run(s) of %s as %s (%s) in %.2fs%s", len(ended), what, MLFLOW_STATUS[status],
             status.value, time.monotonic() - started, f": {', '.join(ended)}" if ended else "")
    return thread, list(ended)


_clients: dict[str, Any] = {}  # MlflowClient by tracking URI, for the driver's preparation and stop
_clients_lock = threading.Lock()


def _mlflow_client(tracking_uri: str) -> Any:
    """One ``MlflowClient`` per tracking URI in this process (a stop waits here for the one its
    preparation is making rather than making another)."""
    with _clients_lock:
        client = _clients.get(tracking_uri)
        if client is None:
            from mlflow.tracking import MlflowClient

            client = _clients[tracking_uri] = MlflowClient(tracking_uri=tracking_uri)
        return client


def _end_running_mlflow_runs(tracking_uri: str, experiment: str, tags: dict[str, str], status: RunStatus, *,
                             keep: Collection[str] = (), started_after_ms: int | None = None) -> list[str]:
    """``end_running_mlflow_runs`` on one tracking server and experiment; the MLflow runs in
    ``keep`` are left running."""
    for key, value in tags.items():
        if "'" in value or "`" in key:  # not a Tessera id (hex, a spec name); cannot go into a filter
            raise ValueError(f"tag {key}={value!r} cannot be searched for")
    client = _mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:  # rank 0 never created a run there
        return []
    match = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    if started_after_ms is not None:
        match += f" and attributes.start_time >= {int(started_after_ms)}"
    running = client.search_runs([found.experiment_id], filter_string=f"{match} and attributes.status = 'RUNNING'")
    ended = []
    for run in running:
        if run.info.run_id not in keep:
            end_mlflow_run(client, run.info.run_id, status)
            ended.append(run.info.run_id)
    return ended
