"""Where the Trainer's step goes beyond a hand-written loop's, on the tiny CNN of ``bench/loop.py``.

    .venv/bin/python bench/loop_ablation.py [--rounds 10] [--out docs/bench/loop-ablation-DATE.json]
    .venv/bin/python bench/loop_ablation.py --quick     # smoke test, a few seconds

``bench/loop.py`` measures the whole Trainer against the plain loop and a ``floor`` (the plain
loop's step inside the Trainer's loop and loader). This script fills in the rest: first what the
harness and the Trainer's loader cost on their own, then, in the Trainer's loop, steps that add
one part of the Trainer's own step at a time, each against the plain loop in the same harness
(``loop.interleaved``, this thread's CPU time):

- ``harness``: not the Trainer's loop at all, but the plain loop's own batches (a permutation
  per epoch, sliced and indexed) and step on the Trainer's model and optimizer, taking the same
  turns: what any loop scores in this harness, its ceiling;
- ``loader``: the same step on the Trainer's loader (``TensorLoader``), in a bare loop;
- ``floor``: ``loop.bare_step`` in ``Trainer.fit``: the step through ``State``, the timestamp
  moved on, and the fit loop's checks (checkpoint, evaluation and metric flush due);
- ``state``: the step reads and writes its tensors through ``State`` and computes the loss with
  the run's loss function (``soft_cross_entropy``), as the Trainer does, and tests 9 times
  whether to dispatch an event: what a Trainer that skipped an empty engine would run;
- ``events``: plus the 9 engine dispatches of a step, with no algorithms and no callbacks;
- ``scheduler``: plus the learning-rate read and ``BatchLambdaLR.step``;
- ``metrics``: plus the detached loss handed to the metric buffer;
- ``trainer``: ``Trainer.train_batch`` itself (microbatch, scaler and sync checks on top).

Each part's cost is the drop in the ratio from the line above it (the ``harness`` row's own
distance from 1 is what the turn-taking costs the Trainer's side). The medians of rounds are the
figures; per-round ratios move by about a percent on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import pathlib
import platform
import statistics
import sys
from typing import Any, Callable

# bench/loop.py, found in this script's folder, first: it puts the repository root first on the
# import path and drops bench/ (whose algorithms.py would shadow Tessera's `algorithms` package).
import loop  # isort: skip
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from workers.events import Event  # noqa: E402
from workers.trainer import Trainer  # noqa: E402


def ablated_step(trainer: Trainer, inputs: torch.Tensor, targets: torch.Tensor, *, events: bool,
                 scheduler: bool, metrics: bool) -> None:
    """The plain step through ``State`` and the run's loss function, plus the parts switched on:
    the Trainer's 9 ``events`` (without them, only their ``if``: what a Trainer that skipped
    dispatching to an empty engine would run), the learning-rate read and the ``scheduler``'s
    step, and the detached loss handed to the ``metrics`` buffer. One function for every row,
    so that no row pays a call the others do not."""
    state, engine = trainer.state, trainer.engine
    lr = state.optimizer.param_groups[0]["lr"] if scheduler else None
    state.inputs, state.targets = inputs, targets
    if events:
        engine.run_event(Event.AFTER_DATALOADER, state)
    state.optimizer.zero_grad(set_to_none=True)
    if events:
        engine.run_event(Event.BEFORE_FORWARD, state)
    state.outputs = state.model(state.inputs)
    if events:
        engine.run_event(Event.AFTER_FORWARD, state)
        engine.run_event(Event.BEFORE_LOSS, state)
    state.loss = state.loss_fn(state.outputs, state.targets)
    if events:
        engine.run_event(Event.AFTER_LOSS, state)
        engine.run_event(Event.BEFORE_BACKWARD, state)
    state.loss.backward()
    if events:
        engine.run_event(Event.AFTER_BACKWARD, state)
        engine.run_event(Event.AFTER_TRAIN_BATCH, state)
    state.optimizer.step()
    if scheduler:
        state.scheduler.step()
    state.timestamp = state.timestamp.after_batch(samples=inputs.shape[0])
    if events:
        engine.run_event(Event.BATCH_END, state)
    if metrics:
        trainer.metrics.add_step(state.timestamp.batch, state.loss.detach(), lr)


def harness_fit(trainer: Trainer, turns: Callable[[Any], Any]) -> None:
    """The plain loop inside the harness: its own batches and step (as ``loop.plain_steps``), on
    the Trainer's model, optimizer and tensors, taking turns as the Trainer's loader does."""
    state, loader = trainer.state, trainer.train_loader
    model, optimizer, images, labels = state.model, state.optimizer, loader.images, loader.labels
    batch_size = loader.batch_size

    # loop.plain_steps' batching, line for line. Not shared with it: a generator of batches there
    # would add a layer to the plain side, the baseline every row is measured against.
    def batches():
        epoch = 0
        while True:
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
            for first in range(0, len(labels) - batch_size + 1, batch_size):
                chosen = order[first:first + batch_size]
                yield images[chosen], labels[chosen]
            epoch += 1

    for inputs, targets in itertools.islice(turns(batches()), state.max_batches):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()


def loader_fit(trainer: Trainer, turns: Callable[[Any], Any]) -> None:
    """The same step on the Trainer's loader (which takes the turns), epoch after epoch."""
    state, loader = trainer.state, trainer.train_loader
    model, optimizer = state.model, state.optimizer
    done, epoch = 0, 0
    while done < state.max_batches:
        loader.set_epoch(epoch)
        for inputs, targets in itertools.islice(loader, state.max_batches - done):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(inputs), targets)
            loss.backward()
            optimizer.step()
            done += 1
        epoch += 1


# Loops of their own, in place of ``Trainer.fit``.
FITS: dict[str, Callable[[Trainer, Callable[[Any], Any]], None]] = {"harness": harness_fit, "loader": loader_fit}
# Each other row through one ``partial``: the same calls around every step.
STEPS: dict[str, Callable[[Trainer, torch.Tensor, torch.Tensor], None]] = {
    "floor": functools.partial(loop.bare_step),
    "state": functools.partial(ablated_step, events=False, scheduler=False, metrics=False),
    "events": functools.partial(ablated_step, events=True, scheduler=False, metrics=False),
    "scheduler": functools.partial(ablated_step, events=True, scheduler=True, metrics=False),
    "metrics": functools.partial(ablated_step, events=True, scheduler=True, metrics=True),
    "trainer": functools.partial(Trainer.train_batch),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="20 steps, 2 rounds: a smoke test, not a measurement")
    parser.add_argument("--out", help="also write the JSON report here")
    args = parser.parse_args()
    case = loop.CASES["tiny"]
    steps, rounds = (loop.QUICK_STEPS["tiny"], 2) if args.quick else (case["steps"], args.rounds)
    spec = loop.run_spec(case, steps)
    loop.interleaved(case, loop.run_spec(case, max(2, steps // 4)))  # warm the allocator and kernels, untimed
    rows = ({name: {"fit": fit} for name, fit in FITS.items()}
            | {name: {"train_batch": step} for name, step in STEPS.items()})
    ratios: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(rounds):
        for name, row in rows.items():
            clock = loop.interleaved(case, spec, **row)
            ratios[name].append(clock["plain_cpu"] / clock["trainer_cpu"])
        print(f"round {r}: " + ", ".join(f"{name} {values[-1]:.3f}" for name, values in ratios.items()),
              file=sys.stderr, flush=True)
    medians = {name: round(statistics.median(values), 4) for name, values in ratios.items()}
    report: dict[str, Any] = {
        "command": "bench/loop_ablation.py " + " ".join(sys.argv[1:]), "quick": args.quick,
        "machine": f"{os.cpu_count()} CPU cores shared with other jobs; one torch thread per loop",
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "case": {"model": case["model"], "batch_size": case["batch_size"], "steps": steps, "rounds": rounds},
        "cpu_ratio_vs_plain_median": medians,
        "cpu_ratio_vs_plain_per_round": {name: [round(x, 4) for x in values] for name, values in ratios.items()},
    }
    text = json.dumps(report, indent=2)
    print(text)
    print("CPU time, plain / this step (medians): "
          + ", ".join(f"{name} {value:.3f}" for name, value in medians.items()))
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
