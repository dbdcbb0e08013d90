"""Checkpoint benchmark: DCP to S3 (moto over HTTP) vs a raw boto3 multipart transfer of the same
bytes, and the training-step stall of async vs sync saves.

    .venv/bin/python bench/checkpoint.py [--model resnet18] [--repeats 3] [--only transfer|stall]

Prints a JSON report. S3 is moto's server on loopback (real HTTP, in this process), so the
ratios measure client-side overheads (DCP planning, per-file requests, serialization), not a
real network; absolute MB/s are those of this machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.local_s3 import start_s3  # noqa: E402  (after the path insert)


def model_and_optimizer(name: str):
    import torch

    from api.specs import RunSpec
    from workers.models import build_model

    spec = RunSpec.model_validate({"name": "bench", "model": {"name": name},
                                   "data": {"train": {"name": "synthetic", "num_classes": 10}, "batch_size": 8},
                                   "optimizer": {"name": "adamw", "lr": 1e-3}, "max_duration": "1ba"})
    torch.manual_seed(0)
    model = build_model(spec.model, num_classes=10, in_channels=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    optimizer.step()  # optimizer state exists: ~3x the parameter bytes in all
    return model, optimizer


def bench_transfer(args, client, bucket: str) -> dict:
    import boto3.s3.transfer
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from workers.checkpoint.manager import WRITE_THREADS  # what the trainer uses
    from workers.checkpoint.reader import ParallelFsspecReader  # what the trainer loads with

    model, optimizer = model_and_optimizer(args.model)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    config = boto3.s3.transfer.TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20,
                                              max_concurrency=4)
    # dcp_load: our reader; dcp_load_stock: torch's FsspecReader, interleaved for comparison.
    rows = {"dcp_save": [], "dcp_load": [], "dcp_load_stock": [], "raw_upload": [], "raw_download": []}
    dcp_bytes = 0
    for i in range(args.repeats):
        url = f"s3://{bucket}/dcp/{i}"
        start = time.perf_counter()
        dcp.save(state, storage_writer=FsspecWriter(url, thread_count=WRITE_THREADS), no_dist=True)
        rows["dcp_save"].append(time.perf_counter() - start)
        dcp_bytes = sum(obj["Size"] for obj in client.list_objects_v2(Bucket=bucket, Prefix=f"dcp/{i}/")["Contents"])
        readers = [("dcp_load", ParallelFsspecReader), ("dcp_load_stock", FsspecReader)]
        for key, reader in readers if i % 2 == 0 else readers[::-1]:  # alternate who goes first
            target_sd, target_osd = get_state_dict(model, optimizer)
            start = time.perf_counter()
            dcp.load({"model": target_sd, "optim": target_osd}, storage_reader=reader(url), no_dist=True)
            rows[key].append(time.perf_counter() - start)

        start = time.perf_counter()
        client.upload_fileobj(io.BytesIO(payload), bucket, f"raw/{i}.pt", Config=config)
        rows["raw_upload"].append(time.perf_counter() - start)
        out = io.BytesIO()
        start = time.perf_counter()
        client.download_fileobj(bucket, f"raw/{i}.pt", out, Config=config)
        rows["raw_download"].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in rows.items()}
    mb = len(payload) / 1e6
    return {
        "model": args.model, "payload_mb": round(mb, 1), "dcp_mb": round(dcp_bytes / 1e6, 1), "repeats": args.repeats,
        "median_s": {k: round(v, 3) for k, v in median.items()},
        "save_mb_per_s": {"dcp": round(mb / median["dcp_save"], 1), "raw": round(mb / median["raw_upload"], 1)},
        "load_mb_per_s": {"dcp": round(mb / median["dcp_load"], 1),
                          "dcp_stock": round(mb / median["dcp_load_stock"], 1),
                          "raw": round(mb / median["raw_download"], 1)},
        "ratio_dcp_over_raw": {"save": round(median["raw_upload"] / median["dcp_save"], 2),
                               "load": round(median["raw_download"] / median["dcp_load"], 2),
                               "load_stock_reader": round(median["raw_download"] / median["dcp_load_stock"], 2)},
    }


def bench_stall(args, bucket: str) -> dict:
    """Wall time of the same short training run without checkpoints, with sync saves and with
    async saves every ``--interval`` batches, plus the time the loop spent blocked in save()."""
    from api.specs import RunSpec
    from workers.reporter import NullSink
    from workers.trainer import Trainer, process_settings

    results = {}
    for mode in ("none", "sync", "async"):
        body = {"name": "stall", "model": {"name": "cifar_resnet20", "params": {"width": 16}},
                "data": {"train": {"name": "synthetic", "num_samples": 4096, "image_size": 32}, "batch_size": 64},
                "optimizer": {"name": "adamw", "lr": 1e-3}, "max_duration": f"{args.steps}ba",
                "parallelism": {"cpus_per_worker": 1}, "seed": 1}
        if mode != "none":
            body["checkpoint"] = {"interval": f"{args.interval}ba", "keep_last": 2, "async_save": mode == "async"}
        spec = RunSpec.model_validate(body)
        with process_settings(spec):
            url = f"s3://{bucket}/stall/{mode}-{time.time_ns()}" if mode != "none" else None
            trainer = Trainer(spec, sink=NullSink(), checkpoint_url=url)
            blocked = []
            if trainer.checkpointer is not None:
                original = trainer.checkpointer.save

                def timed_save(**kwargs):
                    start = time.perf_counter()
                    original(**kwargs)
                    blocked.append(time.perf_counter() - start)

                trainer.checkpointer.save = timed_save
            start = time.perf_counter()
            trainer.fit()
            wall = time.perf_counter() - start
        results[mode] = {"wall_s": round(wall, 2), "saves": len(blocked), "blocked_s": round(sum(blocked), 3),
                         "blocked_per_save_s": round(statistics.mean(blocked), 3) if blocked else 0.0}
    step_s = results["none"]["wall_s"] / args.steps
    for mode in ("sync", "async"):
        r = results[mode]
        # The loop's stall: time blocked in save() per step, as a fraction of a step.
        r["stall_fraction_of_step"] = round(r["blocked_s"] / args.steps / step_s, 4)
        r["wall_overhead_fraction"] = round(r["wall_s"] / results["none"]["wall_s"] - 1, 4)
    results["step_s"] = round(step_s, 4)
    results["interval_batches"] = args.interval
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=int, default=20)
    parser.add_argument("--only", choices=["transfer", "stall"], help="run one of the two benchmarks")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 2)))
    bucket = "tessera-bench"
    server, client = start_s3(bucket)
    try:
        report = {}
        if args.only in (None, "transfer"):
            report["transfer"] = bench_transfer(args, client, bucket)
        if args.only in (None, "stall"):
            report["stall"] = bench_stall(args, bucket)
        report.update(torch=torch.__version__, cpus=os.cpu_count(), load_average=os.getloadavg())
    finally:
        server.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
