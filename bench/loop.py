"""Loop benchmark: steps/s of Tessera's ``Trainer`` against a hand-written PyTorch loop.

    .venv/bin/python bench/loop.py --out docs/bench/loop-DATE.json   # ~3 min on 2 busy cores
    .venv/bin/python bench/loop.py --quick                          # smoke test, a few seconds
    python bench/loop.py --device cuda --out docs/bench/loop-gpu-DATE.json   # on a GPU, ~2 min

Both sides train the same model (same initial weights), on the same in-memory synthetic
images, with the same SGD optimizer, batch size and one torch thread. The Trainer runs with no
algorithms, no evaluation and no checkpoints, reporting to a ``NullSink``; the plain loop is
what a user writes by hand (randperm per epoch, index the tensors, zero_grad, forward,
cross-entropy, backward, step) and never syncs with the host. The two take turns step by step
in this process (``interleaved``): whenever the Trainer asks its loader for a batch, its clock
stops and the plain loop takes one step, so machine load (2 cores shared with other jobs) hits
both alike. Each round is one ``fit`` of ``steps`` batches; per round, three ratios of Trainer
steps/s over plain steps/s: total wall time (``ratio``), median step (``step_ratio``: robust to
a side descheduled for tens of milliseconds, blind to once-a-second work) and this thread's CPU
time (``cpu_ratio``: one torch thread does all the compute, and waiting for a core does not
count). The headlines are their medians over rounds.

Cases: ResNet-20 (compute-bound: overheads vanish) and a tiny CNN on 8x8 images, whose
sub-millisecond step makes every microsecond of per-step Python show. The tiny case also runs
the Trainer with 5 do-nothing algorithms, and a ``floor``: the Trainer's loop, loader and turn
taking around the plain loop's own step (``bare_step``), about as close to 1 as a Trainer with
this loop could come. The harness itself is not free: the plain loop's own code, run in the
Trainer's seat, scores about 0.99 (``bench/loop_ablation.py``, its ``harness`` row).

With ``--device cuda`` (``main_gpu``) the cases are ``GPU_CASES`` and the harness is
``alternating``: a GPU runs both sides' kernels from one queue, so each round times a whole
``Trainer.fit`` and as many plain steps, one after the other, each between two
``torch.cuda.synchronize()``, which side goes first alternating by round.

``engine`` is the cost of dispatching one event with 5 algorithms that match every event and
do nothing, against the same engine with none, and that cost times the events a step fires as
a fraction of the tiny case's step. ``calls_per_step`` counts ``Engine.run_event`` calls per
training step with algorithms on the engine (9: AFTER_DATALOADER, the six forward/loss/backward
events, AFTER_TRAIN_BATCH, BATCH_END), ``calls_per_step_no_algorithms`` the same without any (0:
a step dispatches nothing to an empty engine) and ``python_calls_per_step`` the Python calls a
step makes beyond the plain loop's
(``sys.setprofile``: a count, not a timing); the smoke test in tests/bench pins both so that
added per-step work shows up. Between a step's kernels, every call costs several times what
a micro-benchmark says (a batch's two index operations: 3-5x their cost in a loop of their own).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Any, Callable

# This script sits next to bench/algorithms.py, which is named like Tessera's `algorithms`
# package: drop bench/ from the import path and put the repository root first.
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if pathlib.Path(p or ".").resolve() != _HERE]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from algorithms.base import Algorithm  # noqa: E402
from api.specs import RunSpec  # noqa: E402
from workers.data.synthetic import make_synthetic  # noqa: E402
from workers.engine import Engine  # noqa: E402
from workers.events import Event  # noqa: E402
from workers.models import build_model  # noqa: E402
from workers.trainer import Trainer, process_settings  # noqa: E402

CASES: dict[str, dict[str, Any]] = {
    # name: model, images (channels, size), batch size, samples in the set, steps per timed
    # round, rounds.
    "resnet20": {"model": {"name": "cifar_resnet20"}, "channels": 3, "image_size": 32, "batch_size": 32,
                 "num_samples": 512, "steps": 16, "rounds": 6},
    "tiny": {"model": {"name": "simple_cnn", "params": {"width": 4, "hidden": 16}}, "channels": 1,
             "image_size": 8, "batch_size": 16, "num_samples": 1024, "steps": 300, "rounds": 10},
}
QUICK_STEPS = {"resnet20": 2, "tiny": 20}
# On a GPU (``--device cuda``): the same models, ResNet-20 also at a batch that keeps a large GPU
# busy; more steps per round, since a step takes well under a millisecond of host time.
GPU_CASES: dict[str, dict[str, Any]] = {
    "tiny": {**CASES["tiny"], "steps": 1000, "rounds": 10},
    "resnet20": {**CASES["resnet20"], "steps": 200, "rounds": 10},
    "resnet20_b256": {**CASES["resnet20"], "batch_size": 256, "num_samples": 4096, "steps": 100, "rounds": 10},
}
LR = 0.05


def run_spec(case: dict[str, Any], steps: int, *, gpu: bool = False) -> RunSpec:
    return RunSpec.model_validate({
        "name": "bench-loop", "model": case["model"],
        "data": {"train": {"name": "synthetic", "num_samples": case["num_samples"], "channels": case["channels"],
                           "image_size": case["image_size"]}, "batch_size": case["batch_size"]},
        "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.9}, "max_duration": f"{steps}ba", "seed": 0,
        "parallelism": {"use_gpu": gpu}})


def plain_steps(case: dict[str, Any], spec: RunSpec, device: torch.device = torch.device("cpu")):
    """A hand-written loop over the same model, data and optimizer, one step per ``next()``;
    built here, before the first step. On a GPU each batch is indexed on the host and copied
    over, as the Trainer's loader does."""
    images, labels = make_synthetic("train", num_samples=case["num_samples"], channels=case["channels"],
                                    image_size=case["image_size"])
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, num_classes=10, in_channels=case["channels"], image_size=case["image_size"],
                        domain="image").to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    model.train()

    def steps():
        batch_size, epoch, on_host = case["batch_size"], 0, device.type == "cpu"
        while True:
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
            for first in range(0, len(labels) - batch_size + 1, batch_size):
                chosen = order[first:first + batch_size]
                inputs, targets = images[chosen], labels[chosen]
                if not on_host:
                    inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(inputs), targets)
                loss.backward()
                optimizer.step()
                yield loss
            epoch += 1

    return steps()


def interleaved(case: dict[str, Any], spec: RunSpec, algorithms: list[Algorithm] | None = None, *,
                train_batch: Callable[[Trainer, torch.Tensor, torch.Tensor], None] | None = None,
                fit: Callable[[Trainer, Callable[[Any], Any]], None] | None = None) -> dict[str, float]:
    """Seconds spent by ``Trainer.fit`` (all of it, FIT_START to FIT_END; the build is not
    timed) and by the plain loop over as many steps, run step by step in turn: each time the
    trainer asks its loader for a batch, its clock stops and the plain loop takes one step.
    Alternating every few milliseconds, both sides see the same machine load. With
    ``train_batch``, the Trainer's loop runs ``train_batch(trainer, inputs, targets)`` instead of
    its own step (the ``floor``: ``bare_step``, the plain loop's work inside the Trainer's loop).
    With ``fit``, ``fit(trainer, turns)`` runs instead of ``trainer.fit()``: a loop of its own
    whose batches come from ``turns(batches)``, which takes the same turns with the plain loop
    (``bench/loop_ablation.py``: the harness's and the loader's own cost)."""
    plain = plain_steps(case, spec)
    clock = {"trainer": 0.0, "plain": 0.0, "trainer_cpu": 0.0, "plain_cpu": 0.0}
    per_step: dict[str, list[float]] = {"trainer": [], "plain": []}
    with process_settings(spec):
        trainer = Trainer(spec)
        if algorithms:
            trainer.engine.algorithms = trainer.state.algorithms = list(algorithms)
        if train_batch is not None:
            trainer.train_batch = lambda inputs, targets: train_batch(trainer, inputs, targets)
        loader = trainer.train_loader
        batches_of = type(loader).__iter__
        mark = [0.0, 0.0]  # wall, this thread's CPU time

        def turns(batches):
            for batch in batches:
                paused, paused_cpu = time.perf_counter(), time.thread_time()
                clock["trainer"] += paused - mark[0]
                clock["trainer_cpu"] += paused_cpu - mark[1]
                per_step["trainer"].append(paused - mark[0])  # the previous step, batch fetch included
                last_loss = next(plain)
                mark[:] = time.perf_counter(), time.thread_time()
                clock["plain"] += mark[0] - paused
                clock["plain_cpu"] += mark[1] - paused_cpu
                per_step["plain"].append(mark[0] - paused)
                yield batch
            del last_loss

        loader.__class__ = type("TakingTurns", (type(loader),), {"__iter__": lambda self: turns(batches_of(self))})
        gc.collect()  # the previous round's cycles, now rather than on either side's clock
        mark[:] = time.perf_counter(), time.thread_time()
        if fit is None:
            trainer.fit()
        else:
            fit(trainer, turns)
        clock["trainer"] += time.perf_counter() - mark[0]
        clock["trainer_cpu"] += time.thread_time() - mark[1]
    # The typical step of each side: robust to a process descheduled for tens of milliseconds,
    # but blind to work done once a second (metric flushes), which the totals include. The
    # trainer's first entry is FIT_START up to its first batch, not a step.
    clock["trainer_step_median"] = statistics.median(per_step["trainer"][1:])
    clock["plain_step_median"] = statistics.median(per_step["plain"])
    return clock


def bare_step(trainer: Trainer, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    """The plain loop's step, plus the timestamp the Trainer's loop needs to end: what the
    Trainer would cost if its own step did nothing more (the ``floor`` side)."""
    state = trainer.state
    state.optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(state.model(inputs), targets)
    loss.backward()
    state.optimizer.step()
    state.timestamp = state.timestamp.after_batch(samples=inputs.shape[0])


class DoNothing(Algorithm):
    """Matches every event and does nothing: the engine's dispatch cost, alone."""

    name = "do_nothing"
    events = frozenset(Event)

    def apply(self, event: Event, state: Any) -> None:
        """Nothing: what is measured is the engine's cost of calling it at every event."""


def calls_per_step(spec: RunSpec, steps: int, algorithms: list[Algorithm] | None = None) -> float:
    """``Engine.run_event`` calls per training step over a short fit (untimed), with
    ``algorithms`` on the engine; the per-fit and per-epoch events (FIT_*, EPOCH_*, EVAL_*) are
    not counted."""
    once = {Event.FIT_START, Event.FIT_END, Event.EPOCH_START, Event.EPOCH_END, Event.EVAL_START, Event.EVAL_END}
    with process_settings(spec):
        trainer = Trainer(spec)
        if algorithms:
            trainer.engine.algorithms = trainer.state.algorithms = list(algorithms)
        counted = {"calls": 0}
        run_event = trainer.engine.run_event

        def counting(event, state):
            counted["calls"] += event not in once
            run_event(event, state)

        trainer.engine.run_event = counting
        trainer.fit()
    return counted["calls"] / steps


def count_python_calls(fn: Callable[[], Any]) -> int:
    """Function and builtin calls (and generator resumptions) that ``fn()`` makes, as
    ``sys.setprofile`` sees them in this thread."""
    count = 0

    def profiler(frame, event, arg):
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(profiler)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def python_calls_per_step(case: dict[str, Any], steps: tuple[int, int] = (64, 192)) -> dict[str, float]:
    """Python calls per training step of the Trainer and of the plain loop: not a timing but the
    count of per-step work, which the smoke test pins. The Trainer's is the difference of two
    fits of whole epochs (its per-fit work cancels out), with metrics flushed at epoch ends only,
    so the count does not depend on the machine's speed."""
    fits = []
    for n in (steps[0],) + steps:  # the first fit only warms up (lazy imports, first-call caches)
        spec = run_spec(case, n)
        with process_settings(spec):
            trainer = Trainer(spec)
            trainer.metrics.interval_s = math.inf
            fits.append(count_python_calls(trainer.fit))
    trainer_calls = (fits[2] - fits[1]) / (steps[1] - steps[0])
    spec = run_spec(case, 1)
    with process_settings(spec):
        plain = plain_steps(case, spec)
        next(plain)
        n = steps[1] - steps[0]
        plain_calls = count_python_calls(lambda: [next(plain) for _ in range(n)]) / n
    return {"trainer": round(trainer_calls, 2), "plain": round(plain_calls, 2),
            "trainer_extra": round(trainer_calls - plain_calls, 2)}


def engine_cost(rounds: int, events: int) -> dict[str, float]:
    """CPU seconds per ``run_event`` with 5 do-nothing algorithms and with none, taking turns
    in short blocks (CPU time of this thread: waiting for a core does not count)."""
    state = object()
    per_event: dict[str, list[float]] = {"none": [], "five": []}
    step_events = [Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS,
                   Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.BATCH_END]
    engines = {"none": Engine(), "five": Engine([DoNothing() for _ in range(5)])}
    blocks = max(1, events // 800)
    for _ in range(rounds):
        spent = {key: 0.0 for key in engines}
        for _ in range(blocks):
            for key, engine in engines.items():
                start = time.thread_time()
                for _ in range(100):
                    for event in step_events:
                        engine.run_event(event, state)
                spent[key] += time.thread_time() - start
        for key in engines:
            per_event[key].append(spent[key] / (blocks * 800))
    return {key: statistics.median(values) for key, values in per_event.items()}


def compare(name: str, case: dict[str, Any], *, steps: int, rounds: int, with_noop: bool) -> dict[str, Any]:
    """Rounds of Trainer vs plain, interleaved step by step; with ``with_noop``, each round also
    has the Trainer with 5 do-nothing algorithms and the ``floor`` (``bare_step``) against plain."""
    spec = run_spec(case, steps)
    interleaved(case, run_spec(case, max(2, steps // 4)))  # warm the allocator and kernels, untimed
    sides = ["trainer"] + (["trainer_5noop", "floor"] if with_noop else [])
    ratios: dict[str, list[float]] = {side: [] for side in sides}
    step_ratios: dict[str, list[float]] = {side: [] for side in sides}
    cpu_ratios: dict[str, list[float]] = {side: [] for side in sides}
    rates: dict[str, list[float]] = {"plain": [], **{side: [] for side in sides}}
    for r in range(rounds):
        for side in sides:
            clock = interleaved(case, spec, [DoNothing() for _ in range(5)] if side == "trainer_5noop" else None,
                                train_batch=bare_step if side == "floor" else None)
            ratios[side].append(clock["plain"] / clock["trainer"])  # trainer steps/s over plain steps/s
            step_ratios[side].append(clock["plain_step_median"] / clock["trainer_step_median"])
            cpu_ratios[side].append(clock["plain_cpu"] / clock["trainer_cpu"])
            rates[side].append(steps / clock["trainer"])
            rates["plain"].append(steps / clock["plain"])
        print(f"{name} round {r}: " + ", ".join(f"{s} / plain {ratios[s][-1]:.3f} (median step {step_ratios[s][-1]:.3f}, "
                                               f"CPU {cpu_ratios[s][-1]:.3f})"
                                               for s in sides)
              + f" (plain {rates['plain'][-1]:.1f} steps/s)", file=sys.stderr, flush=True)
    row: dict[str, Any] = {"steps": steps, "rounds": rounds, "batch_size": case["batch_size"], "model": case["model"],
                           "image": [case["channels"], case["image_size"], case["image_size"]]}
    for side, values in rates.items():
        row[f"{side}_steps_per_s"] = round(statistics.median(values), 2)
    row["ratio_per_round"] = [round(x, 4) for x in ratios["trainer"]]
    row["ratio_median"] = round(statistics.median(ratios["trainer"]), 4)
    # Median step against median step, per round: the same comparison without the descheduling
    # spikes a shared machine puts into one side or the other (flush work excluded, see above).
    row["step_ratio_per_round"] = [round(x, 4) for x in step_ratios["trainer"]]
    row["step_ratio_median"] = round(statistics.median(step_ratios["trainer"]), 4)
    # CPU time of this thread (one torch thread: all the compute), which waiting for a core
    # does not inflate: the load-robust figure on a shared machine.
    row["cpu_ratio_per_round"] = [round(x, 4) for x in cpu_ratios["trainer"]]
    row["cpu_ratio_median"] = round(statistics.median(cpu_ratios["trainer"]), 4)
    if with_noop:
        row["noop5_cpu_ratio_median"] = round(statistics.median(cpu_ratios["trainer_5noop"]), 4)
        # About how close to 1 a Trainer with this loop could come: its loop, loader and
        # turn-taking around the plain loop's own step.
        row["floor_cpu_ratio_median"] = round(statistics.median(cpu_ratios["floor"]), 4)
        row["floor_ratio_median"] = round(statistics.median(ratios["floor"]), 4)
        row["noop5_ratio_median"] = round(statistics.median(ratios["trainer_5noop"]), 4)
        row["noop5_vs_trainer"] = round(row["noop5_ratio_median"] / row["ratio_median"], 4)
    return row


def alternating(case: dict[str, Any], spec: RunSpec, steps: int, *, trainer_first: bool = True) -> dict[str, float]:
    """On a GPU: seconds of ``Trainer.fit`` and of the plain loop over as many steps, one after
    the other, each between two ``torch.cuda.synchronize()``: the GPU runs both sides' kernels
    from one queue, so the CPU harness's step-by-step turns would time kernel launches, not
    steps. Builds are not timed; each side's first step is."""
    device = torch.device("cuda", torch.cuda.current_device())
    clock: dict[str, float] = {}

    def timed(side: str, run: Callable[[], Any]) -> None:
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        clock[side] = time.perf_counter() - started

    with process_settings(spec):
        trainer, plain = Trainer(spec), plain_steps(case, spec, device)
        sides = [("trainer", trainer.fit), ("plain", lambda: [next(plain) for _ in range(steps)])]
        for side, run in sides if trainer_first else sides[::-1]:
            timed(side, run)
    return clock


def compare_gpu(name: str, case: dict[str, Any], *, steps: int, rounds: int) -> dict[str, Any]:
    """Rounds of Trainer and plain on the GPU, after an untimed warm-up round."""
    spec = run_spec(case, steps, gpu=True)
    alternating(case, run_spec(case, max(2, steps // 4), gpu=True), max(2, steps // 4))
    ratios: list[float] = []
    rates: dict[str, list[float]] = {"trainer": [], "plain": []}
    for r in range(rounds):
        clock = alternating(case, spec, steps, trainer_first=r % 2 == 0)  # which goes first alternates
        ratios.append(clock["plain"] / clock["trainer"])  # trainer steps/s over plain steps/s
        for side in rates:
            rates[side].append(steps / clock[side])
        print(f"{name} round {r}: trainer / plain {ratios[-1]:.3f} (plain {rates['plain'][-1]:.0f} steps/s)",
              file=sys.stderr, flush=True)
    return {"steps": steps, "rounds": rounds, "batch_size": case["batch_size"], "model": case["model"],
            "image": [case["channels"], case["image_size"], case["image_size"]],
            "trainer_steps_per_s": round(statistics.median(rates["trainer"]), 1),
            "plain_steps_per_s": round(statistics.median(rates["plain"]), 1),
            "ratio_per_round": [round(x, 4) for x in ratios], "ratio_median": round(statistics.median(ratios), 4)}


def main_gpu(args: argparse.Namespace) -> None:
    """``--device cuda``: Trainer vs plain steps/s on this machine's first GPU."""
    if not torch.cuda.is_available():
        sys.exit("bench/loop.py --device cuda: this machine has no usable GPU (torch.cuda.is_available() is False)")
    report: dict[str, Any] = {
        "command": "bench/loop.py " + " ".join(sys.argv[1:]), "quick": args.quick,
        "machine": f"{torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores",
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "cases": {},
    }
    for name in (args.cases or ",".join(GPU_CASES)).split(","):
        case = GPU_CASES[name]
        steps = 20 if args.quick else case["steps"]
        rounds = 2 if args.quick else args.rounds or case["rounds"]
        report["cases"][name] = compare_gpu(name, case, steps=steps, rounds=rounds)
    text = json.dumps(report, indent=2)
    print(text)
    for name, row in report["cases"].items():
        print(f"{name}: Trainer / plain steps/s on the GPU = {row['ratio_median']:.3f} (median of {row['rounds']} "
              f"rounds; plain {row['plain_steps_per_s']:.0f} steps/s)")
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, help="rounds per case (default: the case's own)")
    parser.add_argument("--cases", help="comma-separated (default: tiny,resnet20; with --device cuda: "
                                         f"{','.join(GPU_CASES)})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 2 rounds: a smoke test, not a measurement")
    parser.add_argument("--out", help="also write the JSON report here")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: Trainer vs plain on the first GPU, in whole rounds one after the other")
    args = parser.parse_args()
    if args.device == "cuda":
        return main_gpu(args)

    report: dict[str, Any] = {
        "command": "bench/loop.py " + " ".join(sys.argv[1:]), "quick": args.quick,
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs; one torch thread per loop",
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "cases": {},
    }
    for name in (args.cases or "tiny,resnet20").split(","):
        case = CASES[name]
        steps = QUICK_STEPS[name] if args.quick else case["steps"]
        rounds = 2 if args.quick else args.rounds or case["rounds"]
        report["cases"][name] = compare(name, case, steps=steps, rounds=rounds, with_noop=name == "tiny")
    tiny = CASES["tiny"]
    spec = run_spec(tiny, QUICK_STEPS["tiny"])
    report["calls_per_step"] = calls_per_step(spec, QUICK_STEPS["tiny"], [DoNothing() for _ in range(5)])
    report["calls_per_step_no_algorithms"] = calls_per_step(spec, QUICK_STEPS["tiny"])
    report["python_calls_per_step"] = python_calls_per_step(tiny)
    cost = engine_cost(rounds=3 if args.quick else 15, events=8_000 if args.quick else 16_000)
    engine: dict[str, Any] = {"seconds_per_event_no_algorithms": cost["none"],
                              "seconds_per_event_5_noop_algorithms": cost["five"],
                              "extra_us_per_step_5_noop": round((cost["five"] - cost["none"]) * 1e6
                                                                * report["calls_per_step"], 2)}
    if "tiny" in report["cases"]:
        step_s = 1 / report["cases"]["tiny"]["trainer_steps_per_s"]
        engine["extra_fraction_of_tiny_step"] = round(engine["extra_us_per_step_5_noop"] * 1e-6 / step_s, 4)
    report["engine"] = engine
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2)
    print(text)
    for name, row in report["cases"].items():
        print(f"{name}: Trainer / plain steps/s = {row['ratio_median']:.3f}, median step {row['step_ratio_median']:.3f},"
              f" CPU time {row['cpu_ratio_median']:.3f}"
              f" (medians of {row['rounds']} rounds)")
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
