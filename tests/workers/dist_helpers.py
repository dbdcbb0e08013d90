"""Run a ``Trainer`` on N ranks of a real gloo process group in spawned processes (no Ray):
the cheapest way to exercise DDP/FSDP checkpoints across world sizes."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any, Callable

from api.specs import RunSpec


def _rank_main(rank: int, world_size: int, init_file: str, spec_json: str, checkpoint_url: str,
               result_path: str) -> None:
    import torch.distributed as dist

    from workers.reporter import MemorySink
    from workers.trainer import Trainer, process_settings

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        spec = RunSpec.model_validate_json(spec_json)
        sink = MemorySink()
        with process_settings(spec):
            trainer = Trainer(spec, sink=sink, checkpoint_url=checkpoint_url)
            metrics = trainer.fit()
            groups = _process_groups()
            trainer.close()  # frees the checkpointer's gloo group (what a reused rank relies on)
        if rank == 0:
            Path(result_path).write_text(json.dumps({
                "metrics": metrics, "checkpoints": sink.checkpoints, "resumed_from": trainer.resumed_from,
                "loss_steps": [step for step, _ in sink.values("train/loss")],
                "groups_freed_by_close": groups - _process_groups()}))
        # Tear down together: a rank that destroys the group while its peer still uses it can
        # abort that peer's process at exit (gloo: "terminate called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _process_groups() -> int:
    """How many process groups this process holds (torch's private registry: no public count)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_map)


def run_on_ranks(spec: RunSpec, *, world_size: int, checkpoint_url: str, work_dir: Path,
                 timeout_s: float = 240) -> dict[str, Any]:
    """Train ``spec`` on ``world_size`` spawned ranks; returns rank 0's metrics, checkpoint
    reports, the checkpoint it resumed from, the steps it reported losses for and how many
    process groups ``Trainer.close`` freed."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tag = os.urandom(4).hex()
    init_file, result_path = work_dir / f"pg-{tag}", work_dir / f"result-{tag}.json"
    spawn_ranks(_rank_main, [(rank, world_size, str(init_file), spec.model_dump_json(), checkpoint_url,
                              str(result_path)) for rank in range(world_size)], timeout_s=timeout_s)
    return json.loads(result_path.read_text())


def _run_then_exit(target: Callable[..., None], *args: Any) -> None:
    """Run one rank; once it has returned, leave without the interpreter's teardown, where gloo's
    threads can still abort the process after a clean run (SIGABRT, "terminate called without an
    active exception": seen once in a fresh-clone suite, rank 1 of the FSDP OOM test, after
    rank 0 had exited 0). A rank that raises exits 1 as before."""
    target(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_ranks(target: Callable[..., None], args_per_rank: list[tuple], *, timeout_s: float) -> None:
    """Run ``target(*args)`` for each rank's args in spawned processes; assert every rank exits 0
    within ``timeout_s`` (a rank still alive then is killed: collectives out of step hang)."""
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_run_then_exit, args=(target, *args)) for args in args_per_rank]
    for proc in procs:
        proc.start()
    try:
        for proc in procs:
            proc.join(timeout_s)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    codes = [proc.exitcode for proc in procs]
    assert codes == [0] * len(procs), f"ranks exited with {codes} (a rank failed or hung)"
