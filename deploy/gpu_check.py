"""GPU acceptance checks for a Tessera worker node; run through ``deploy/gpu_check.sh``.

Each check trains through Tessera's own code (``workers.local.train_local``: in this process
for one worker, on a local Ray with Ray Train for DDP/FSDP2) on synthetic data, small enough
that all of them finish in a few minutes on one modern GPU:

- ``ddp_nccl`` / ``fsdp2_nccl``: every visible GPU, one worker each (NCCL process group);
- ``bf16`` and ``fp16_gradscaler``: mixed precision, finite losses;
- ``oom_microbatch``: a batch that cannot fit in a capped share of GPU memory, with
  ``microbatch_size: auto``: the CUDA OOM is caught and the microbatch halved until it fits;
- ``dcp_resume``: a run stopped at a checkpoint (torch.distributed.checkpoint) and resumed ends
  bitwise equal to the same run uninterrupted (``deterministic: true``);
- ``deterministic_pools``: PyTorch refuses ``AdaptiveAvgPool2d``'s CUDA backward under
  deterministic mode (for outputs other than 1x1, which it computes as a mean); the pool
  ``deterministic: true`` swaps in (``workers.deterministic``) runs it, bitwise repeatable, with
  the plain pool's gradients;
- ``speedup_recipe``: ResNet-18 with channels_last + BlurPool + label smoothing + progressive
  resizing under bf16;
- ``resnet50_bf16_vs_fp32``: images/s of ResNet-50 training steps at batch 256 (64 on a GPU of
  less than 40 GiB; fp32 convolutions use TF32, PyTorch's default for cuDNN); passes when bf16
  is faster (at batch 64 on an H200 it was not: 0.90x);
- ``low_precision_norms``: the GPU-only methods. Under bf16 autocast, LowPrecisionLayerNorm's and
  LowPrecisionGroupNorm's norms return bf16 (they ran in 16 bits; plain ones return fp32) within
  0.1 of the fp32 result; FusedLayerNorm swaps in apex's kernel when apex is installed (same
  outputs) and is a noted no-op without it; gpt_small trains 20 batches on shakespeare with
  low_precision_layernorm and fused_layernorm under bf16.

- ``service_e2e``: ``tessera serve`` as ``make serve`` runs it (SQLite, local storage, embedded
  Ray head) trains a DDP run and then an FSDP2 + channels_last run on the GPU to COMPLETED,
  submitted through the SDK; the second run's job driver is forked from the warm interpreter
  the first started (``workers.fork_exec``).

Prints one PASS/FAIL line per check and a table; exits 1 if any check failed. Without CUDA it
prints ``skipped: no GPU`` and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OOM_MEMORY_GIB = 4.0  # the share of GPU memory the OOM check allows itself
# cuBLAS is deterministic only with a fixed workspace, and PyTorch reads this once per process,
# at its first cuBLAS call under deterministic mode: set before any check runs, as the Trainer
# sets it in a worker process (``workers.trainer.process_settings``).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def base_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """A small GPU run: simple_cnn on 32x32 synthetic images, 20 batches."""
    spec: dict[str, Any] = {
        "name": name,
        "model": {"name": "simple_cnn", "params": {"width": 32, "hidden": 128}},
        "data": {"train": {"name": "synthetic", "num_samples": 4096, "image_size": 32}, "batch_size": 128},
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "max_duration": "20ba",
        "parallelism": {"strategy": "none", "num_workers": 1, "use_gpu": True},
        "seed": 17,
    }
    spec.update(overrides)
    return spec


EVAL_METRICS: dict[str, Any] = {
    "data": {"train": {"name": "synthetic", "num_samples": 4096, "image_size": 32},
             "eval": {"name": "synthetic", "split": "test", "num_samples": 512, "image_size": 32}, "batch_size": 128},
    "eval_metrics": ["top5_accuracy", "f1_macro", "auroc"],
}


def specs(gpus: int) -> dict[str, dict[str, Any]]:
    """Every RunSpec the checks train, by check name (validated by the unit test without a GPU)."""
    many = {"num_workers": gpus, "use_gpu": True}
    return {
        # With the listed eval metrics: their sums on the device, and AUROC's gather over NCCL.
        "ddp_nccl": base_spec("gpu-ddp", parallelism={"strategy": "ddp", **many}, **EVAL_METRICS),
        "fsdp2_nccl": base_spec("gpu-fsdp2", parallelism={"strategy": "fsdp", **many}, precision="amp_bf16",
                                **EVAL_METRICS),
        # Deterministic too: every eval metric's CUDA kernels must be ones PyTorch's deterministic mode allows.
        "bf16": base_spec("gpu-bf16", precision="amp_bf16", deterministic=True, **EVAL_METRICS),
        "fp16_gradscaler": base_spec("gpu-fp16", precision="amp_fp16"),
        "oom_microbatch": base_spec(
            "gpu-oom", model={"name": "resnet18"}, max_duration="2ba", microbatch_size="auto",
            data={"train": {"name": "synthetic", "num_samples": 1024, "image_size": 224}, "batch_size": 1024}),
        "dcp_resume": base_spec("gpu-dcp", deterministic=True, max_duration="12ba",
                                checkpoint={"interval": "6ba", "keep_last": 2}),
        "speedup_recipe": base_spec(
            "gpu-recipe", model={"name": "resnet18"}, precision="amp_bf16", max_duration="30ba",
            data={"train": {"name": "synthetic", "num_samples": 4096, "image_size": 64}, "batch_size": 128},
            algorithms=[{"name": "channels_last"}, {"name": "blurpool"}, {"name": "label_smoothing"},
                        {"name": "progressive_resizing"}]),
        "low_precision_norms": base_spec(
            "gpu-lp-norms", model={"name": "gpt_small"}, precision="amp_bf16",
            data={"train": {"name": "shakespeare", "split": "train"}, "batch_size": 32},
            algorithms=[{"name": "low_precision_layernorm"}, {"name": "fused_layernorm"}]),
    }


def _train(spec: dict[str, Any], checkpoint_dir: str | None = None) -> dict[str, float]:
    from api.specs import RunSpec
    from workers.local import train_local
    from workers.reporter import MemorySink

    return train_local(RunSpec.model_validate(spec), sink=MemorySink(), checkpoint_dir=checkpoint_dir)


def _finished(metrics: dict[str, float], spec: dict[str, Any]) -> str:
    import math

    batches = int(spec["max_duration"].removesuffix("ba"))
    assert metrics["time/batch"] == batches, f"stopped at batch {metrics['time/batch']}, not {batches}"
    loss = metrics.get("train/loss")
    assert loss is not None and math.isfinite(loss), f"train/loss is {loss}"
    listed = [f"eval/{name}" for name in spec.get("eval_metrics", [])]
    missing = [key for key in listed if not 0.0 <= metrics.get(key, -1.0) <= 1.0]
    assert not missing, f"eval metrics missing or outside [0, 1]: {missing} of {sorted(metrics)}"
    return f"{batches} batches, loss {loss:.3f}" + (f", {len(listed)} eval metrics" if listed else "")


def check_training(name: str, gpus: int) -> str:
    spec = specs(gpus)[name]
    detail = _finished(_train(spec), spec)
    workers = spec["parallelism"]["num_workers"]
    return f"{workers} GPU worker(s), {detail}"


def check_oom_microbatch(gpus: int) -> str:
    import torch

    class Recorder(logging.Handler):
        messages: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.messages.append(record.getMessage())

    recorder = Recorder()
    logging.getLogger().addHandler(recorder)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, OOM_MEMORY_GIB * 2**30 / total), 0)
    try:
        spec = specs(gpus)["oom_microbatch"]
        detail = _finished(_train(spec), spec)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
        logging.getLogger().removeHandler(recorder)
    halvings = [m for m in recorder.messages if "out of memory with microbatches of" in m]
    assert halvings, "the batch fit without an out-of-memory error: nothing was halved"
    return f"{len(halvings)} halving(s), last: {halvings[-1]!r}; {detail}"


def check_dcp_resume(gpus: int) -> str:
    return stop_resume_and_compare(specs(gpus)["dcp_resume"])


def stop_resume_and_compare(spec: dict[str, Any]) -> str:
    """Train ``spec`` whole, and again stopped at its first checkpoint then resumed; the two
    final checkpoints must hold bitwise equal tensors."""
    import torch

    from api.specs import RunSpec
    from workers.checkpoint import Checkpointer, read_checkpoint
    from workers.local import local_run_url

    stop_at = spec["checkpoint"]["interval"]
    end = int(spec["max_duration"].removesuffix("ba"))
    with tempfile.TemporaryDirectory() as whole_dir, tempfile.TemporaryDirectory() as split_dir:
        _train(spec, checkpoint_dir=whole_dir)
        _train({**spec, "max_duration": stop_at}, checkpoint_dir=split_dir)   # stops at a checkpoint
        _finished(_train(spec, checkpoint_dir=split_dir), spec)               # resumes from it

        def final(directory: str) -> dict[str, Any]:
            url = f"{local_run_url(RunSpec.model_validate(spec), directory)}/checkpoints"
            info = Checkpointer(url, fingerprint={}).latest_committed()
            assert info is not None and info.step == end, f"no checkpoint of batch {end} under {url}"
            return read_checkpoint(info.url)

        whole, split = _flatten(final(whole_dir)), _flatten(final(split_dir))
    assert whole.keys() == split.keys()
    tensors = [k for k, v in whole.items() if isinstance(v, torch.Tensor)]
    unequal = [k for k in tensors if not torch.equal(whole[k].cpu(), split[k].cpu())]
    assert tensors and not unequal, f"{len(unequal)} of {len(tensors)} tensors differ after resume"
    return f"stopped and resumed at {stop_at}; {len(tensors)} tensors bitwise equal at batch {end}"


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _flatten(value, f"{prefix}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, value in enumerate(tree) for k, v in _flatten(value, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): tree}


def resnet50_images_per_second(dtype_name: str, *, batch: int, steps: int = 15, warmup: int = 5) -> float:
    """Training steps of torchvision's ResNet-50 (channels_last, 224x224) per second x batch."""
    import torch
    import torchvision

    device = torch.device("cuda")
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images = torch.randn(batch, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]

    def step() -> None:
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not torch.float32):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - started)


def check_throughput(gpus: int) -> str:
    import torch

    torch.backends.cudnn.benchmark = True
    # fp32 ResNet-50 training takes about 30 GB at batch 256; a small card gets batch 64 (where
    # bf16 may not be faster: 0.90x on an H200, too little work per step to gain)
    batch = 256 if torch.cuda.get_device_properties(0).total_memory >= 40 * 2**30 else 64
    fp32 = resnet50_images_per_second("fp32", batch=batch)
    bf16 = resnet50_images_per_second("bf16", batch=batch)
    detail = f"batch {batch}: fp32 {fp32:.0f} img/s, bf16 {bf16:.0f} img/s, x{bf16 / fp32:.2f}"
    assert bf16 > fp32, f"bf16 is not faster than fp32: {detail}"
    return detail


def check_deterministic_pools(gpus: int) -> str:
    """Under ``torch.use_deterministic_algorithms(True)`` (``deterministic: true``) PyTorch refuses
    ``AdaptiveAvgPool2d``'s CUDA backward; the pool the Trainer swaps in runs it, twice to the
    same bit, and gives the gradients of the plain pool (computed without the mode)."""
    import torch
    import torch.nn as nn

    from workers.deterministic import DeterministicAdaptiveAvgPool2d

    details = []
    for shape, size in [((16, 64, 8, 8), 4), ((16, 64, 7, 7), 3), ((16, 64, 7, 7), 1)]:
        x = torch.randn(*shape, device="cuda")
        weights = torch.randn(shape[0], shape[1], size, size, device="cuda")

        def gradient(pool: nn.Module) -> torch.Tensor:
            leaf = x.clone().requires_grad_(True)
            (pool(leaf) * weights).sum().backward()
            return leaf.grad

        expected = gradient(nn.AdaptiveAvgPool2d(size))
        torch.use_deterministic_algorithms(True)
        try:
            try:
                gradient(nn.AdaptiveAvgPool2d(size))
                refused = False
            except RuntimeError as exc:
                refused = "deterministic" in str(exc)
            first, second = (gradient(DeterministicAdaptiveAvgPool2d(size)) for _ in range(2))
        finally:
            torch.use_deterministic_algorithms(False)
        assert torch.equal(first, second), f"{shape} -> {size}: two backward passes differ"
        error = (first - expected).abs().max().item()
        assert error < 1e-5, f"{shape} -> {size}: gradients differ from AdaptiveAvgPool2d's by {error}"
        details.append(f"{shape[-1]}->{size}: {'refused plain, ' if refused else ''}max err {error:.1e}")
    return "; ".join(details)


def check_low_precision_norms(gpus: int) -> str:
    import copy
    import warnings

    import torch
    import torch.nn as nn

    import algorithms.functional as af
    from algorithms.base import NoEffectWarning
    from algorithms.fused_layernorm import apex_fused_layernorm

    torch.manual_seed(0)
    details = []
    cases = [("layernorm", nn.Sequential(nn.Linear(256, 256), nn.LayerNorm(256)), torch.randn(64, 256),
              af.apply_low_precision_layernorm),
             ("groupnorm", nn.Sequential(nn.Conv2d(16, 32, 3), nn.GroupNorm(4, 32)), torch.randn(8, 16, 32, 32),
              af.apply_low_precision_groupnorm)]
    for name, plain, x, apply in cases:
        plain, x = plain.cuda(), x.cuda()
        low = apply(copy.deepcopy(plain), "amp_bf16")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            expected, got = plain(x), low(x)
        assert expected.dtype == torch.float32, f"plain {name} under autocast gave {expected.dtype}"
        assert got.dtype == torch.bfloat16, f"low-precision {name} gave {got.dtype}, not bfloat16"
        error = (got.float() - expected).abs().max().item()
        assert error < 0.1, f"low-precision {name} differs from fp32 by {error}"
        details.append(f"{name} bf16 max err {error:.3f}")
    norm = nn.LayerNorm(256).cuda()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = af.apply_fused_layernorm(nn.Sequential(copy.deepcopy(norm)))
    if apex_fused_layernorm() is None:
        assert any(issubclass(w.category, NoEffectWarning) for w in caught), "no note without apex"
        details.append("fused: apex absent, noted no-op")
    else:
        x = torch.randn(64, 256, device="cuda")
        assert type(fused[0]) is not nn.LayerNorm, "apex installed but LayerNorm was not replaced"
        error = (fused(x) - norm(x)).abs().max().item()
        assert error < 1e-4, f"apex FusedLayerNorm differs by {error}"
        details.append(f"fused: apex, max err {error:.1e}")
    spec = specs(gpus)["low_precision_norms"]
    details.append(f"gpt_small {_finished(_train(spec), spec)}")
    return "; ".join(details)


def service_specs(use_gpu: bool) -> list[dict[str, Any]]:
    """The two runs of ``service_e2e``: DDP, then FSDP2 with channels_last (a pair that failed at
    wrapping until FSDP made NHWC weights contiguous), one worker each, bf16 on a GPU."""
    common: dict[str, Any] = {"precision": "amp_bf16" if use_gpu else "fp32",
                              "checkpoint": {"interval": "10ba", "keep_last": 2}}
    return [base_spec("gpu-service-ddp", parallelism={"strategy": "ddp", "num_workers": 1, "use_gpu": use_gpu},
                      **common),
            base_spec("gpu-service-fsdp", parallelism={"strategy": "fsdp", "num_workers": 1, "use_gpu": use_gpu},
                      algorithms=[{"name": "channels_last"}], **common)]


def service_e2e(*, use_gpu: bool = True, timeout_s: float = 240) -> str:
    """``tessera serve`` (SQLite, local storage, its embedded Ray head) in a temporary home, and
    the ``service_specs`` runs submitted through the SDK one after the other, each to COMPLETED
    on the device it asked for. The first run's driver starts the node's warm interpreter
    (``workers.fork_exec``); the second's is forked from it."""
    import secrets
    import shutil
    import signal
    import socket
    import subprocess

    import httpx

    from api.client import Client

    home = tempfile.mkdtemp(prefix="gpu-check-service-")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    key = "tsk_" + secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "RAY_ADDRESS"))}
    env.update(TESSERA_HOME=home, TESSERA_PUBLIC_URL=url, TESSERA_BOOTSTRAP_API_KEY=key,
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p))
    log_path = Path(home) / "service.log"
    server = subprocess.Popen([sys.executable, "-c", "from cli import main; main()", "serve", "--host", "127.0.0.1",
                               "--port", url.rsplit(":", 1)[1]], env=env, cwd=ROOT, stdout=log_path.open("wb"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:  # ready once its embedded Ray head takes jobs
            assert server.poll() is None, f"the service exited: {log_path.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "the service did not get ready"
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if httpx.get(f"{url}/healthz", timeout=5).json().get("ray") == "ok":
                    break
            time.sleep(0.5)
        client = Client(url, api_key=key)
        device = "cuda" if use_gpu else "cpu"
        details = []
        for number, spec in enumerate(service_specs(use_gpu), start=1):
            started = time.monotonic()
            run = client.create_run(spec)
            final = client.wait(run.id, timeout=max(10.0, deadline - time.monotonic()))
            assert final.status.value == "COMPLETED", f"run {number} ended {final.status.value}: {final.error}"
            running = [e.message or "" for e in client.run_events(run.id).data if e.to_status.value == "RUNNING"]
            assert any(device in m for m in running), f"run {number} did not train on {device}: {running}"
            fork_line = next(line for line in client.logs(run.id).text.splitlines()
                             if line.startswith("workers.fork_exec:"))
            if number == 1:  # wait until the warm interpreter it started serves
                server_log = Path(fork_line.split(" at ")[1].split(":")[0]).with_suffix(".log")
                while not (server_log.exists() and "serving" in server_log.read_text()):
                    assert time.monotonic() < deadline, f"no fork server serves at {server_log.with_suffix('.sock')}"
                    time.sleep(0.2)
            else:
                assert "forked as pid" in fork_line, f"run {number}'s driver was not forked: {fork_line}"
            details.append(f"{spec['parallelism']['strategy']} {time.monotonic() - started:.0f}s")
        return f"2 runs COMPLETED on {device} through the service ({', '.join(details)}); the second's driver forked"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(home, ignore_errors=True)


CHECKS: dict[str, Callable[[int], str]] = {
    "service_e2e": lambda gpus: service_e2e(),  # first: its Ray head before the checks' own local Ray
    "ddp_nccl": lambda gpus: check_training("ddp_nccl", gpus),
    "fsdp2_nccl": lambda gpus: check_training("fsdp2_nccl", gpus),
    "bf16": lambda gpus: check_training("bf16", gpus),
    "fp16_gradscaler": lambda gpus: check_training("fp16_gradscaler", gpus),
    "oom_microbatch": check_oom_microbatch,
    "dcp_resume": check_dcp_resume,
    "deterministic_pools": check_deterministic_pools,
    "speedup_recipe": lambda gpus: check_training("speedup_recipe", gpus),
    "resnet50_bf16_vs_fp32": check_throughput,
    "low_precision_norms": check_low_precision_norms,
}


def run(names: list[str], gpus: int) -> list[tuple[str, bool, float, str]]:
    results = []
    for name in names:
        started = time.monotonic()
        try:
            detail, ok = CHECKS[name](gpus), True
        except Exception as exc:  # one failing check must not hide the others
            traceback.print_exc()
            detail, ok = f"{type(exc).__name__}: {exc}".splitlines()[0][:300], False
        elapsed = time.monotonic() - started
        print(f"{'PASS' if ok else 'FAIL'} {name} ({elapsed:.0f}s): {detail}", flush=True)
        results.append((name, ok, elapsed, detail))
    return results


def table(results: list[tuple[str, bool, float, str]]) -> str:
    width = max(len(name) for name, *_ in results)
    lines = [f"{'check':<{width}}  result  seconds  detail", "-" * (width + 40)]
    lines += [f"{name:<{width}}  {'PASS' if ok else 'FAIL':<6}  {elapsed:7.1f}  {detail}"
              for name, ok, elapsed, detail in results]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checks", nargs="*", metavar="CHECK", help=f"checks to run (default: all): {', '.join(CHECKS)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.checks if name not in CHECKS]
    if unknown:
        parser.error(f"unknown check(s) {unknown}; choose from {list(CHECKS)}")
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        return 0
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpus} x {torch.cuda.get_device_name(0)}",
          flush=True)
    results = run(args.checks or list(CHECKS), gpus)
    print(table(results))
    failed = [name for name, ok, *_ in results if not ok]
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
