"""deploy/gpu_check.sh without a GPU: it says it skipped and exits 0; its python parts import,
their RunSpecs validate, and the resume comparison works (on CPU, with a tiny spec)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.specs import RunSpec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "gpu_check.sh"


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "deploy" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_without_a_gpu_the_script_skips_and_exits_zero():
    result = run_script()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("skipped: no GPU")


def test_an_unknown_check_is_refused_by_name():
    result = run_script("bf17")
    assert result.returncode == 2 and "unknown check(s) ['bf17']" in result.stderr


def test_the_script_is_valid_bash_and_executable():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK)


def test_the_checks_cover_what_a_gpu_node_must_do_and_their_specs_validate():
    gpu_check = load_gpu_check()
    assert set(gpu_check.CHECKS) == {"service_e2e", "ddp_nccl", "fsdp2_nccl", "bf16", "fp16_gradscaler", "oom_microbatch",
                                     "dcp_resume", "deterministic_pools", "speedup_recipe", "resnet50_bf16_vs_fp32",
                                     "low_precision_norms"}
    specs = {name: RunSpec.model_validate(body) for name, body in gpu_check.specs(gpus=4).items()}
    assert set(specs) <= set(gpu_check.CHECKS)
    assert all(s.parallelism.use_gpu for s in specs.values())
    assert (specs["ddp_nccl"].parallelism.strategy, specs["ddp_nccl"].parallelism.num_workers) == ("ddp", 4)
    assert (specs["fsdp2_nccl"].parallelism.strategy, specs["fsdp2_nccl"].parallelism.num_workers) == ("fsdp", 4)
    assert specs["bf16"].precision.value == "amp_bf16" and specs["fp16_gradscaler"].precision.value == "amp_fp16"
    assert specs["oom_microbatch"].microbatch_size == "auto" and specs["dcp_resume"].deterministic
    assert len(specs["speedup_recipe"].algorithms) >= 2
    assert specs["low_precision_norms"].precision.value == "amp_bf16"
    assert {a.name for a in specs["low_precision_norms"].algorithms} == {"low_precision_layernorm", "fused_layernorm"}
    ddp, fsdp = (RunSpec.model_validate(body) for body in gpu_check.service_specs(use_gpu=True))
    assert (ddp.parallelism.strategy, fsdp.parallelism.strategy) == ("ddp", "fsdp")
    assert ddp.parallelism.use_gpu and [a.name for a in fsdp.algorithms] == ["channels_last"]


def test_the_resume_comparison_passes_for_a_real_resume_on_cpu():
    gpu_check = load_gpu_check()
    spec = gpu_check.base_spec("cpu-resume", parallelism={"strategy": "none", "num_workers": 1, "use_gpu": False},
                               deterministic=True, max_duration="6ba", checkpoint={"interval": "2ba", "keep_last": 2},
                               data={"train": {"name": "synthetic", "num_samples": 128, "image_size": 8},
                                     "batch_size": 16})
    assert "bitwise equal at batch 6" in gpu_check.stop_resume_and_compare(spec)


def test_the_eval_metrics_a_gpu_run_lists_are_checked_for_on_cpu():
    gpu_check = load_gpu_check()
    spec = {**gpu_check.specs(1)["ddp_nccl"], "max_duration": "2ba",
            "parallelism": {"strategy": "none", "num_workers": 1, "use_gpu": False}}
    assert gpu_check._finished(gpu_check._train(spec), spec).endswith(", 3 eval metrics")
    with pytest.raises(AssertionError, match="eval metrics missing"):
        gpu_check._finished({"time/batch": 2, "train/loss": 1.0}, spec)


def test_the_table_marks_failures():
    gpu_check = load_gpu_check()
    text = gpu_check.table([("bf16", True, 1.0, "ok"), ("dcp_resume", False, 2.0, "AssertionError: differ")])
    assert "PASS" in text.splitlines()[2] and "FAIL" in text.splitlines()[3]
