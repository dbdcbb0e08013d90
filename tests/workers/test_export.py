"""The exported model: written at the end of training, rebuilt by ``load_model`` with surgery
replayed, and exactly as accurate on the eval set as the run reported."""

from __future__ import annotations

import json

import torch

from api.catalog import DATASETS
from workers.data import build_eval_loader
from workers.export import load_model, read_export
from workers.loss import eval_metrics, eval_sums
from workers.paths import checkpoints_url, export_url, run_url
from workers.reporter import MemorySink
from workers.trainer import train
from tests.workers.helpers_specs import digits_spec


@torch.no_grad()
def eval_metrics_of(model: torch.nn.Module, spec) -> dict[str, float]:
    """What the trainer's evaluation computes, on one process."""
    loader = build_eval_loader(spec, rank=0, world_size=1, device=torch.device("cpu"))
    loader.set_epoch(0)
    sums = torch.zeros(3, dtype=torch.float64)
    for inputs, targets in loader:
        sums += eval_sums(model(inputs), targets)
    return eval_metrics(*sums.tolist(), domain=DATASETS[spec.data.train.name].domain)


def test_export_reloads_with_surgery_and_matches_the_reported_accuracy(tmp_path):
    spec = digits_spec(max_duration="1ep", algorithms=[{"name": "blurpool"}, {"name": "channels_last"}])
    run = run_url(f"file://{tmp_path}", "r1")
    sink = MemorySink()
    train(spec, sink=sink, checkpoint_url=checkpoints_url(run))
    reported = sink.values("eval/accuracy")[-1][1]
    step = sink.values("eval/accuracy")[-1][0]

    exported = export_url(run, step, "safetensors")
    state, metadata = read_export(open(exported.removeprefix("file://"), "rb").read())
    assert [s["name"] for s in json.loads(metadata["tessera.surgery"])] == ["blurpool", "channels_last"]
    assert json.loads(metadata["tessera.metrics"])["eval/accuracy"] == reported
    assert state and all(isinstance(t, torch.Tensor) for t in state.values())

    for path in (exported, export_url(run, step, "torch").removeprefix("file://")):
        model = load_model(path)
        assert any(type(m).__name__.lower().startswith("blur") for m in model.modules())  # surgery replayed
        assert eval_metrics_of(model, spec)["eval/accuracy"] == reported
