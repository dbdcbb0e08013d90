"""Running a ``RunSpec`` on Ray Train: the only module that touches ``ray.train``.

``fit_with_ray`` builds a ``TorchTrainer`` whose workers each run ``train_loop_per_worker``:
they rebuild everything from the spec (sent as JSON), train one rank each, and rank 0 reports
to the service (or prints, without one) and returns its final metrics. Ray's ``TorchConfig``
creates the process group: gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from api.client import Client
from api.specs import RunSpec
from api.views import RunStatus
from workers.errors import TrainingError, describe
from workers.reporter import ConsoleReporter, MetricSink, NullSink, ServiceReporter
from workers.trainer import Trainer, process_settings

log = logging.getLogger(__name__)


def default_storage_path() -> str:
    """``$TESSERA_HOME/ray`` as an absolute path (Ray Train v2 needs a storage path, and the
    workers' cwd is Ray's session folder, so relative paths would land there)."""
    return str(Path(os.environ.get("TESSERA_HOME", ".tessera")).resolve() / "ray")


def fit_with_ray(spec: RunSpec, *, run_id: str, service_url: str | None = None, token: str | None = None,
                 storage_path: str | None = None) -> dict[str, float]:
    """Train ``spec`` on ``spec.parallelism.num_workers`` Ray Train workers; returns rank 0's
    final metrics. Needs a connected Ray (``ray.init``).

    With ``service_url`` and ``token``, rank 0 reports status and metrics to the service;
    otherwise it prints progress. Raises ``TrainingError("Type: message")`` carrying the root
    cause when any worker fails (after ``spec.max_restarts`` restarts).
    """
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    parallelism = spec.parallelism
    storage_path = storage_path or default_storage_path()
    if "://" not in storage_path:
        storage_path = os.path.abspath(storage_path)  # workers run in Ray's session folder
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"spec": spec.model_dump_json(), "run_id": run_id,
                           "service_url": service_url, "token": token},
        scaling_config=ScalingConfig(num_workers=parallelism.num_workers, use_gpu=parallelism.use_gpu,
                                     resources_per_worker={"CPU": parallelism.cpus_per_worker}),
        run_config=RunConfig(name=f"tessera-{run_id}", storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=spec.max_restarts)),
        torch_config=TorchConfig(backend="nccl" if parallelism.use_gpu else "gloo"),
    )
    try:
        result = trainer.fit()
    except Exception as exc:
        message = describe(exc)
        log.error("run %s failed: %s", run_id, message)
        raise TrainingError(message) from exc
    return dict(result.return_value or {})


def train_loop_per_worker(config: dict[str, Any]) -> dict[str, float] | None:
    """One Ray Train worker: build from the spec, report RUNNING (rank 0), train."""
    import ray.train
    import ray.train.torch

    spec = RunSpec.model_validate_json(config["spec"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    device = ray.train.torch.get_device() if spec.parallelism.use_gpu else torch.device("cpu")
    sink = _sink_for(config) if rank == 0 else NullSink()
    try:
        with process_settings(spec):
            trainer = Trainer(spec, sink=sink, device=device)
            sink.status(RunStatus.RUNNING, message=f"training on {world_size} worker(s), {device.type}")
            metrics = trainer.fit()
    finally:
        sink.close()
    return metrics if rank == 0 else None


def _sink_for(config: dict[str, Any]) -> MetricSink:
    if config.get("service_url") and config.get("token"):
        return ServiceReporter(Client(config["service_url"]), config["run_id"], config["token"])
    return ConsoleReporter(prefix=f"[{config['run_id']}] ")
