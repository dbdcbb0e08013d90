"""``bench/recipes.py --quick`` runs end to end and writes a JSON report whose numbers hang
together (structure and sanity only: the quick sizes measure nothing).

Part A (no Ray) is a smoke test of well under a minute; part B starts a local Ray and two tiny
Tune sweeps, whose trials each pay Ray Train's start-up (tens of seconds on a busy 2-core
machine), so it runs separately and is marked ``integration``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO_ROOT


def run_quick(out, parts: str, timeout: float):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("RAY_ADDRESS", None)  # the bench starts its own Ray
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "recipes.py"), "--quick", "--parts", parts,
                           "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nbench/recipes.py --quick --parts {parts}: {elapsed:.1f}s\n{done.stdout[-3000:]}")
    return json.loads(out.read_text()), done.stdout, elapsed


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return run_quick(tmp_path_factory.mktemp("recipes") / "quick_a.json", "a", timeout=120)


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    return run_quick(tmp_path_factory.mktemp("recipes") / "quick_b.json", "b", timeout=540)


def is_fraction(value) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


def test_quick_bench_reports_time_to_target_for_baseline_and_recipe_on_every_seed(report):
    result, stdout, _ = report
    assert result["quick"] is True and result["versions"]["torch"] and result["script_sha256"]
    assert "part_b" not in result
    a = result["part_a"]
    assert is_fraction(a["target_screen"])
    screen = a["screen"]
    assert {tuple(r["methods"]) for r in screen if r["fraction"] == 1.0} >= {
        (m,) for m in result["scale"]["screen_methods"]}
    for row in screen:
        assert is_fraction(row["final_accuracy"]) and row["step_time_ratio"] > 0 and row["train_s"] > 0
        assert (row["ttt_ratio"] is None) == (row["ttt_s"] is None)
    assert a["recipe"] is not None and a["recipe"]["methods"]
    seeds = a["seeds"]
    assert [r["seed"] for r in seeds] == result["scale"]["seeds"] and len(seeds) >= 3
    for row in seeds:
        assert is_fraction(row["target"])
        # The baseline reaches its own final accuracy by the end of its training at the latest,
        # and evaluation time is not part of the clock.
        assert 0 < row["baseline_ttt_s"] <= row["baseline_train_s"] + 1e-9
        assert row["target"] == row["baseline_curve"][-1]["accuracy"]
        for curve in (row["baseline_curve"], row["recipe_curve"]):
            batches = [p["batch"] for p in curve]
            clock = [p["train_s"] for p in curve]
            assert batches == sorted(batches) and clock == sorted(clock) and clock[0] > 0
        if row["recipe_ttt_s"] is None:
            assert row["ratio"] is None and max(p["accuracy"] for p in row["recipe_curve"]) < row["target"]
        else:
            assert row["ratio"] == pytest.approx(row["recipe_ttt_s"] / row["baseline_ttt_s"])
    summary = a["summary"]
    assert summary["of"] == len(seeds) and 0 <= summary["reached"] <= len(seeds)
    assert summary["baseline_ttt_s"]["n"] == len(seeds) and summary["baseline_ttt_s"]["std"] >= 0
    if summary["reached"]:
        assert summary["ratio"]["mean"] > 0
    assert "time to the baseline's final accuracy" in stdout


@pytest.mark.integration
def test_quick_bench_compares_asha_with_the_full_grid_over_the_same_sets(sweep_report):
    result, stdout, _ = sweep_report
    assert "part_a" not in result
    b = result["part_b"]
    grid, asha = b["grid"], b["asha"]
    scale = result["scale"]
    num_sets = sum(math.comb(len(scale["sweep_pool"]), k) for k in range(scale["sweep_max_size"] + 1))
    assert len(grid["trials"]) == len(asha["trials"]) == num_sets
    assert sorted(map(tuple, (t["algorithms"] for t in grid["trials"]))) == \
        sorted(map(tuple, (t["algorithms"] for t in asha["trials"])))
    assert all(t["status"].endswith("COMPLETED") for t in grid["trials"]), grid["trials"]
    assert all(t["status"].endswith(("COMPLETED", "STOPPED")) for t in asha["trials"]), asha["trials"]
    max_batches = grid["trials"][0]["batches"]
    assert max_batches > 0 and all(t["batches"] == max_batches for t in grid["trials"])
    assert all(0 < t["batches"] <= max_batches for t in asha["trials"])
    assert grid["batches"] == num_sets * max_batches
    assert 0 < b["batch_ratio"] <= 1.0 and b["train_time_ratio"] > 0
    assert all(is_fraction(t["metric"]) for t in grid["trials"] + asha["trials"])
    assert grid["best"]["metric"] == max(t["metric"] for t in grid["trials"])
    assert isinstance(b["same_best"], bool) and 1 <= b["asha_best_rank_in_grid"] <= num_sets
    assert "ASHA vs full grid" in stdout


def test_quick_time_to_target_bench_fits_a_test_budget(report):
    _, _, elapsed = report
    assert elapsed < 60, f"--quick --parts a took {elapsed:.0f}s; keep it a smoke test"
