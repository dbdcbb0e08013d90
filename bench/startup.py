"""Start-up benchmark: where a run's time goes before its first training step.

    .venv/bin/python bench/startup.py --before HEAD~1 --out /tmp/startup.json          # imports only
    .venv/bin/python bench/startup.py --ray --out /tmp/startup.json   # + first step, 3 ways (minutes)

Part A, the job driver's imports (no Ray cluster): wall time of a fresh interpreter that imports
what the Ray job driver imports (``workers.launch``, ``workers.ray_train``, ``ray.train.torch``),
against the floor any Ray Train driver pays (``ray.train.torch`` alone); with ``--before REF``
also the driver of that commit (``git archive``), so a change to the imports is measured side
by side. Sides take turns, round by round, in this process.

Part B (``--ray``), spawn to first step of the same job, 2 CPU workers, gloo, ResNet-18 on
32x32 synthetic images, one batch of 32, three ways taking turns round by round:
- ``mp_spawn``: ``torch.multiprocessing`` spawns 2 processes that init a gloo process group,
  build data and a torchvision ResNet-18 in DDP and take one step;
- ``ray_torchtrainer``: Ray's own ``TorchTrainer.fit()`` with the same train function body;
- ``tessera``: ``workers.ray_train.fit_with_ray`` of a ``RunSpec`` (what a run's job driver
  calls), whose rank 0 records its phases (``TESSERA_TEST_STARTUP_FILE``).
Phases, from rank 0's clock (Unix time, same machine): ``to_worker`` (start of the call to the
train function: Ray's controller, worker group and process group, or process spawn),
``imports`` (the worker's imports), ``build`` (process group where the function makes it,
data, model, optimizer), ``first_step`` (one batch, returned to the host), ``rest_of_fit``
(Tessera only: what ``fit`` does after that step, as every run ends: metric flushes, a final
checkpoint and evaluation, the model's export; ``to_first_step`` stops before it), and
``teardown`` (until the call returns in this process). Ray is started once in this process
(``ray.init``), as the service's cluster is already up when a run starts.

Part C (``--service``), ``POST /runs`` to the first step through ``tessera serve`` (its own
SQLite, on a Ray head started here with its dashboard, as a cluster would run it), taking turns
with Ray's own ``TorchTrainer.fit()`` on the same head. Phases: ``pickup`` (``POST`` to the
dispatcher's submit: the run's STARTING event), ``to_worker`` (Ray's job start, the job
driver's interpreter and imports, Ray Train's controller, worker group and process group),
then ``imports``, ``build`` and ``first_step`` as in part B. Two services take turns with it:
as shipped, and with ``TESSERA_DRIVER_FORKS=0`` (``service_cold``: no fork server). ``forked``
is 1 where the run's driver was forked from the node's warm interpreter. Before the rounds,
each way's first run (``first_run``), ``--first-run-after`` seconds after the services answer,
as a user's first run comes: the shipped service's is forked from the interpreter its warm-up
job started on the head (``service.driver_warmup``), the cold service's is not.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

_HERE = pathlib.Path(__file__).resolve().parent
REPO_ROOT = _HERE.parent
sys.path[:] = [str(REPO_ROOT)] + [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

DRIVER_IMPORTS = "import workers.launch, workers.ray_train, ray.train.torch"
FLOOR_IMPORTS = "import ray.train.torch"
BATCH_SIZE, IMAGE_SIZE, NUM_WORKERS = 32, 32, 2


# --- part A: the driver's imports --------------------------------------------------------

def import_seconds(code: str, root: pathlib.Path) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of a fresh interpreter running ``code`` with ``root``
    first on the path. CPU time is the load-robust figure: on a shared machine the wall time
    mostly measures waiting for a core."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def checkout(ref: str) -> pathlib.Path:
    """The tree of ``ref`` in a temporary folder."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="bench-startup-"))
    archive = subprocess.run(["git", "archive", ref], cwd=REPO_ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def driver_imports(rounds: int, before: str | None) -> dict[str, Any]:
    sides: dict[str, Callable[[], tuple[float, float]]] = {
        "floor_ray_train_torch": lambda: import_seconds(FLOOR_IMPORTS, REPO_ROOT),
        "driver": lambda: import_seconds(DRIVER_IMPORTS, REPO_ROOT),
    }
    if before:
        old = checkout(before)
        sides["driver_before"] = lambda: import_seconds(DRIVER_IMPORTS, old)
    import_seconds(DRIVER_IMPORTS, REPO_ROOT)  # warm the page cache, untimed
    wall: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    names = list(sides)
    for r in range(rounds):
        for side in names if r % 2 == 0 else names[::-1]:
            seconds, cpu_seconds = sides[side]()
            wall[side].append(seconds)
            cpu[side].append(cpu_seconds)
        print(f"imports round {r}: " + ", ".join(f"{s} {wall[s][-1]:.2f}s (CPU {cpu[s][-1]:.2f}s)" for s in names),
              file=sys.stderr, flush=True)
    row: dict[str, Any] = {"rounds": rounds, "driver_code": DRIVER_IMPORTS, "floor_code": FLOOR_IMPORTS,
                           "before_ref": before}
    pairs = [("driver", "floor_ray_train_torch")]
    if before:
        pairs += [("driver_before", "floor_ray_train_torch"), ("driver", "driver_before")]
    for kind, times in (("wall", wall), ("cpu", cpu)):
        for side in names:
            row[f"{side}_{kind}_s_median"] = round(statistics.median(times[side]), 3)
        for a, b in pairs:
            row[f"{a}_over_{b}_{kind}_median"] = round(statistics.median(x / y for x, y in zip(times[a], times[b])), 4)
        for a, b in pairs:
            row[f"{a}_minus_{b}_{kind}_s_median"] = round(statistics.median(x - y for x, y in zip(times[a], times[b])), 3)
    return row


# --- part B: first step, three ways --------------------------------------------------------

def one_step_job(rank: int, world_size: int, phases_path: str | None, entered: float) -> None:
    """The body every baseline runs in each worker: data, ResNet-18 in DDP, one SGD step."""
    import torch
    import torch.distributed as dist
    import torchvision

    from workers.data.synthetic import make_synthetic

    imported = time.time()
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    images, labels = make_synthetic("train", num_samples=512, image_size=IMAGE_SIZE)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    built = time.time()
    per_rank = BATCH_SIZE // world_size
    chosen = slice(rank * per_rank, (rank + 1) * per_rank)
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(images[chosen]), labels[chosen]).backward()
    optimizer.step()
    if rank == 0 and phases_path:
        pathlib.Path(phases_path).write_text(json.dumps({"worker_entered": entered, "worker_imported": imported,
                                                         "trainer_built": built, "fit_returned": time.time()}))


def _spawned(rank: int, world_size: int, port: int, phases_path: str) -> None:
    entered = time.time()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    one_step_job(rank, world_size, phases_path, entered)
    import torch.distributed as dist

    dist.destroy_process_group()


def _ray_train_fn(config: dict[str, Any]) -> None:
    entered = time.time()
    import ray.train

    context = ray.train.get_context()
    one_step_job(context.get_world_rank(), context.get_world_size(), config["phases_path"], entered)


def run_mp_spawn(phases_path: str, storage: str) -> None:
    import torch.multiprocessing as mp

    from tests.local_ray import free_port

    mp.start_processes(_spawned, args=(NUM_WORKERS, free_port(), phases_path), nprocs=NUM_WORKERS,
                       start_method="spawn")


def run_ray_torchtrainer(phases_path: str, storage: str) -> None:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    TorchTrainer(_ray_train_fn, train_loop_config={"phases_path": phases_path},
                 scaling_config=ScalingConfig(num_workers=NUM_WORKERS, resources_per_worker={"CPU": 1}),
                 run_config=RunConfig(name=f"bench-{time.time_ns()}", storage_path=storage),
                 torch_config=TorchConfig(backend="gloo")).fit()


def run_tessera(phases_path: str, storage: str) -> None:
    from api.specs import RunSpec
    from workers.ray_train import fit_with_ray

    spec = RunSpec.model_validate({
        # torchvision's stem, as the baselines use (Tessera's default keeps 32 px images at full size).
        "name": "bench-startup", "model": {"name": "resnet18", "params": {"small_input_stem": False}},
        "data": {"train": {"name": "synthetic", "num_samples": 512, "image_size": IMAGE_SIZE},
                 "batch_size": BATCH_SIZE},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}, "max_duration": "1ba",
        "parallelism": {"strategy": "ddp", "num_workers": NUM_WORKERS}})
    os.environ["TESSERA_TEST_STARTUP_FILE"] = phases_path  # forwarded to the workers (test_env)
    try:
        fit_with_ray(spec, run_id=f"bench-{time.time_ns()}", storage_path=storage)
    finally:
        os.environ.pop("TESSERA_TEST_STARTUP_FILE", None)


WAYS: dict[str, Callable[[str, str], None]] = {
    "mp_spawn": run_mp_spawn, "ray_torchtrainer": run_ray_torchtrainer, "tessera": run_tessera}


def phases_of(way: str, storage: str) -> dict[str, float]:
    phases_path = os.path.join(storage, f"phases-{way}-{time.time_ns()}.json")
    start = time.time()
    WAYS[way](phases_path, storage)
    returned = time.time()
    p = json.loads(pathlib.Path(phases_path).read_text())
    return {"to_worker": p["worker_entered"] - start, **step_phases(p, start), "teardown": returned - p["fit_returned"],
            "total": returned - start}


def step_phases(p: dict[str, float], start: float) -> dict[str, float]:
    """``imports``, ``build``, ``first_step``, ``rest_of_fit`` and ``to_first_step`` from rank 0's
    timestamps. A baseline's function returns right after its one step; Tessera's ``fit`` goes
    on to end the run (final checkpoint, evaluation, export), so its rank 0 also records when
    the step returned (``first_step_done``)."""
    step_done = p.get("first_step_done", p["fit_returned"])
    return {"imports": p["worker_imported"] - p["worker_entered"], "build": p["trainer_built"] - p["worker_imported"],
            "first_step": step_done - p["trainer_built"], "rest_of_fit": p["fit_returned"] - step_done,
            "to_first_step": step_done - start}


def first_steps(rounds: int) -> dict[str, Any]:
    import ray

    storage = tempfile.mkdtemp(prefix="bench-startup-ray-")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        names = list(WAYS)
        for way in names:  # untimed: the cluster's first Ray Train fit starts its worker pool
            phases_of(way, storage)
        rows: dict[str, list[dict[str, float]]] = {way: [] for way in names}
        for r in range(rounds):
            for way in names if r % 2 == 0 else names[::-1]:
                rows[way].append(phases_of(way, storage))
                print(f"first step round {r}: {way} {rows[way][-1]['to_first_step']:.1f}s", file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    report: dict[str, Any] = {"rounds": rounds, "workers": NUM_WORKERS, "batch_size": BATCH_SIZE, "model": "resnet18"}
    for way, runs in rows.items():
        report[way] = {phase: round(statistics.median(run[phase] for run in runs), 2) for phase in runs[0]}
        report[way]["per_round"] = [{phase: round(value, 2) for phase, value in run.items()} for run in runs]
    ray_times = [run["to_first_step"] for run in rows["ray_torchtrainer"]]
    for way in ("tessera", "mp_spawn"):
        report[f"{way}_over_ray_to_first_step_median"] = round(statistics.median(
            run["to_first_step"] / ray for run, ray in zip(rows[way], ray_times)), 4)
    report["tessera_minus_ray_to_first_step_s_median"] = round(statistics.median(
        t["to_first_step"] - ray for t, ray in zip(rows["tessera"], ray_times)), 2)
    return report


# --- part C: through the service ------------------------------------------------------------

SERVICE_SPEC = {
    "name": "bench-startup", "model": {"name": "resnet18", "params": {"small_input_stem": False}},
    "data": {"train": {"name": "synthetic", "num_samples": 512, "image_size": IMAGE_SIZE}, "batch_size": BATCH_SIZE},
    "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}, "max_duration": "1ba",
    "parallelism": {"strategy": "ddp", "num_workers": NUM_WORKERS}}


def service_phases(client: Any, phases_path: str) -> dict[str, float]:
    """``POST /runs`` of ``SERVICE_SPEC`` to its first step, from the run's events and rank 0's
    phases file (the service forwards ``TESSERA_TEST_*`` to the job)."""
    pathlib.Path(phases_path).unlink(missing_ok=True)
    start = time.time()
    run = client.create_run(SERVICE_SPEC)
    finished = client.wait(run.id, timeout=600)
    if finished.status.value != "COMPLETED":
        raise RuntimeError(f"run {run.id} ended {finished.status.value}: {finished.error}")
    submitted = next(e.time for e in client.run_events(run.id).data if e.to_status.value == "STARTING").timestamp()
    p = json.loads(pathlib.Path(phases_path).read_text())
    forked = "workers.launch forked as pid" in client.logs(run.id).text
    return {"pickup": submitted - start, "to_worker": p["worker_entered"] - submitted, **step_phases(p, start),
            "total": finished.finished_at.timestamp() - start, "forked": float(forked)}


def start_service(head: Any, work: str, name: str, key: str, **extra_env: str) -> tuple[subprocess.Popen, str, str]:
    """``tessera serve`` with its own SQLite under ``work/name`` on ``head``; its process, URL and
    the phases file its runs' rank 0 writes."""
    from tests.local_ray import free_port

    home = os.path.join(work, name)
    os.makedirs(home)
    port = free_port()
    phases_path = os.path.join(home, "phases.json")
    env = {**os.environ, "TESSERA_HOME": home, "TESSERA_RAY_ADDRESS": head.dashboard_url,
           "TESSERA_PUBLIC_URL": f"http://127.0.0.1:{port}", "TESSERA_BOOTSTRAP_API_KEY": key,
           "TESSERA_TEST_STARTUP_FILE": phases_path, "PYTHONPATH": str(REPO_ROOT), **extra_env}
    env.pop("TESSERA_DATABASE_URL", None)
    tessera = str(pathlib.Path(sys.executable).with_name("tessera"))
    server = subprocess.Popen([tessera, "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                              stdout=open(os.path.join(home, "service.log"), "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    return server, f"http://127.0.0.1:{port}", phases_path


def service_first_steps(rounds: int, first_run_after_s: float) -> dict[str, Any]:
    """Part C: ``tessera serve`` on a Ray head of its own (as in production), ``POST /runs`` to
    the first step, taking turns with Ray's own ``TorchTrainer.fit()`` on the same head. Two
    services share the head: ``service`` as shipped (job drivers forked from a warm
    ``workers.fork_server``) and ``service_cold`` with ``TESSERA_DRIVER_FORKS=0`` (every driver a
    fresh interpreter), so the fork server's gain is measured side by side too."""
    import ray

    from api.client import Client
    from bench.control_plane import wait_until_up
    from tests.local_ray import RayHead

    work = tempfile.mkdtemp(prefix="bench-startup-svc-")
    head = RayHead(num_cpus=4, timeout_s=180)
    key = "tsk_" + secrets.token_urlsafe(32)
    servers: dict[str, tuple[subprocess.Popen, str, str]] = {}
    rows: dict[str, list[dict[str, float]]] = {"service": [], "service_cold": [], "ray_torchtrainer": []}
    try:  # filled in here, so that a service that fails to start does not leave the other one running
        servers["service"] = start_service(head, work, "service", key)
        servers["service_cold"] = start_service(head, work, "service_cold", key, TESSERA_DRIVER_FORKS="0")
        ways: dict[str, Callable[[], dict[str, float]]] = {}
        for name, (server, url, phases_path) in servers.items():
            wait_until_up(url, server)
            client = Client(url, api_key=key)
            ways[name] = lambda client=client, phases_path=phases_path: service_phases(client, phases_path)
        ray.init(address=head.address, log_to_driver=False)
        ways["ray_torchtrainer"] = lambda: phases_of("ray_torchtrainer", work)
        time.sleep(first_run_after_s)  # the scenario: a user's first run comes this long after the service is up
        first_run = {"ray_torchtrainer": ways["ray_torchtrainer"]()}  # the head's worker pool starts in this one
        for name in ("service_cold", "service"):
            first_run[name] = ways[name]()
            print(f"first run: {name} {first_run[name]['to_first_step']:.1f}s forked={first_run[name]['forked']:.0f}",
                  file=sys.stderr, flush=True)
        for r in range(rounds):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for name in order:
                rows[name].append(ways[name]())
                print(f"service round {r}: {name} {rows[name][-1]['to_first_step']:.1f}s", file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        for server, _, _ in servers.values():
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
        head.stop()
    report: dict[str, Any] = {"rounds": rounds, "workers": NUM_WORKERS, "batch_size": BATCH_SIZE, "model": "resnet18",
                              "first_run_after_s": first_run_after_s,
                              "first_run": {way: {phase: round(value, 2) for phase, value in run.items()}
                                            for way, run in first_run.items()}}
    report["first_run_service_over_service_cold_to_first_step"] = round(
        first_run["service"]["to_first_step"] / first_run["service_cold"]["to_first_step"], 4)
    if not rounds:
        return report
    for way, runs in rows.items():
        report[way] = {phase: round(statistics.median(run[phase] for run in runs), 2) for phase in runs[0]}
        report[way]["per_round"] = [{phase: round(value, 2) for phase, value in run.items()} for run in runs]
    for a, b in (("service", "ray_torchtrainer"), ("service_cold", "ray_torchtrainer"), ("service", "service_cold")):
        pairs = list(zip(rows[a], rows[b]))
        report[f"{a}_over_{b.removesuffix('_torchtrainer')}_to_first_step_median"] = round(statistics.median(
            x["to_first_step"] / y["to_first_step"] for x, y in pairs), 4)
        report[f"{a}_minus_{b.removesuffix('_torchtrainer')}_to_first_step_s_median"] = round(statistics.median(
            x["to_first_step"] - y["to_first_step"] for x, y in pairs), 2)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of part A (0: skip it)")
    parser.add_argument("--before", help="also time the driver imports of this git ref")
    parser.add_argument("--ray", action="store_true", help="also part B (starts a local Ray; minutes)")
    parser.add_argument("--ray-rounds", type=int, default=3)
    parser.add_argument("--service", action="store_true",
                        help="also part C: POST /runs to first step through `tessera serve` on its own Ray head")
    parser.add_argument("--service-rounds", type=int, default=3)
    parser.add_argument("--first-run-after", type=float, default=10.0,
                        help="part C: seconds between the services answering and their first runs")
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "command": "bench/startup.py " + " ".join(sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "versions": {"python": platform.python_version()},
    }
    if args.rounds:
        report["driver_imports"] = driver_imports(args.rounds, args.before)
    if args.ray:
        report["first_step"] = first_steps(args.ray_rounds)
    if args.service:
        report["service_first_step"] = service_first_steps(args.service_rounds, args.first_run_after)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
