"""``bench/loop.py --quick`` runs end to end, and the Trainer's per-step work stays what it is.

Not timed (a 2-core machine shared with other jobs cannot hold a speed threshold): the smoke
test pins the structure instead. ``calls_per_step`` is the number of engine dispatches per
training step (none when the engine is empty) and ``python_calls_per_step`` the Python calls a
step makes beyond the plain loop's; a change that adds per-step work shows up here and should
be measured with the full bench before it lands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

# AFTER_DATALOADER, BEFORE/AFTER_FORWARD, BEFORE/AFTER_LOSS, BEFORE/AFTER_BACKWARD,
# AFTER_TRAIN_BATCH (gradients synced and unscaled: gradient clipping, SAM), BATCH_END
ENGINE_CALLS_PER_STEP = 9
# Python calls per training step beyond the plain loop's (bench/loop.py's python_calls_per_step,
# with the pinned torch): 20 since a step skips dispatching to an empty engine, 29 since fp32
# steps skip the disabled grad scaler and the autocast context (47 before that, 90 before the
# first trim). A change that adds per-step Python work shows up here; measure it with the full
# bench and raise this only if it pays.
EXTRA_PYTHON_CALLS_PER_STEP = 21


def test_quick_loop_bench_compares_trainer_and_plain_loop_and_counts_engine_calls(tmp_path):
    out = tmp_path / "loop.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "loop.py"), "--quick", "--cases", "tiny",
                           "--out", str(out)], cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["calls_per_step"] == ENGINE_CALLS_PER_STEP
    assert report["calls_per_step_no_algorithms"] == 0
    calls = report["python_calls_per_step"]
    assert calls["plain"] > 0 and 0 < calls["trainer_extra"] <= EXTRA_PYTHON_CALLS_PER_STEP, calls
    tiny = report["cases"]["tiny"]
    assert tiny["rounds"] == len(tiny["ratio_per_round"]) == 2
    assert all(ratio > 0 for ratio in tiny["ratio_per_round"] + tiny["step_ratio_per_round"])
    assert tiny["plain_steps_per_s"] > 0 and tiny["trainer_steps_per_s"] > 0 and tiny["noop5_ratio_median"] > 0
    assert tiny["floor_ratio_median"] > 0 and tiny["floor_cpu_ratio_median"] > 0
    engine = report["engine"]
    assert 0 < engine["seconds_per_event_no_algorithms"] and 0 < engine["seconds_per_event_5_noop_algorithms"]
    assert "tiny: Trainer / plain steps/s" in done.stdout


def test_quick_loop_ablation_times_each_part_of_the_trainers_step(tmp_path):
    """``bench/loop_ablation.py --quick``: the harness's and the loader's own loops, then every step
    variant in the Trainer's loop, each run and timed."""
    out = tmp_path / "ablation.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "loop_ablation.py"), "--quick", "--out", str(out)],
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    rounds = report["cpu_ratio_vs_plain_per_round"]
    assert list(rounds) == ["harness", "loader", "floor", "state", "events", "scheduler", "metrics", "trainer"]
    assert all(len(values) == 2 and all(value > 0 for value in values) for values in rounds.values())
    assert "CPU time, plain / this step (medians): harness" in done.stdout
