"""The exported model: written at the end of training, rebuilt by ``load_model`` with surgery
replayed, and exactly as accurate on the eval set as the run reported."""

from __future__ import annotations

import json

import pytest
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


def test_the_input_transform_turns_raw_images_into_what_the_model_trained_on(tmp_path):
    """scikit-learn's raw 8x8 digits (pixels 0..16), through the export's input transform, score
    what the run reported on its eval set; fed raw, the model does not know them."""
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    from workers.export import load_export

    spec = digits_spec(max_duration="1ep")
    run = run_url(f"file://{tmp_path}", "r2")
    sink = MemorySink()
    train(spec, sink=sink, checkpoint_url=checkpoints_url(run))
    reported, step = sink.values("eval/accuracy")[-1][1], sink.values("eval/accuracy")[-1][0]
    loaded = load_export(export_url(run, step, "safetensors"))
    assert (loaded.step, loaded.metrics["eval/accuracy"], loaded.spec.name) == (step, reported, spec.name)
    assert "0..16 -> 16x16" in repr(loaded.input_transform)

    bunch = sk_load_digits()  # the test split, as the data set makes it, but raw
    _, test = train_test_split(range(len(bunch.target)), test_size=0.2, random_state=0, stratify=bunch.target)
    raw, labels = torch.from_numpy(bunch.images[test]), torch.from_numpy(bunch.target[test])
    with torch.no_grad():
        predicted = loaded.model(loaded.input_transform(raw)).argmax(1)
    assert (predicted == labels).float().mean().item() == pytest.approx(reported, abs=1e-6)
    assert loaded.input_transform(raw[0]).shape == (1, 1, 16, 16)  # one image too
    with pytest.raises(ValueError, match="expected grayscale images"):
        loaded.input_transform(torch.zeros(2, 3, 8, 8))


def test_image_files_go_through_the_data_sets_evaluation_transforms():
    from api.specs import RunSpec
    from workers.data.inference import input_transform
    from workers.data.transforms import SampleTransform

    body = digits_spec().model_dump(mode="json")
    body["data"] = {"train": {"name": "image_folder", "root": "/data/pets", "channels": 3,
                              "transforms": {"resize": 40, "crop": 32, "hflip": True,
                                             "normalize": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.2, 0.2]}}},
                    "batch_size": 8}
    spec = RunSpec.model_validate(body)
    transform = input_transform(spec)
    images = torch.randint(0, 256, (2, 3, 50, 60), dtype=torch.uint8)
    expected = SampleTransform(spec.data.train.transforms, train=False)
    out = transform(images)
    assert out.shape == (2, 3, 32, 32) and torch.equal(out[1], expected(images[1], None))  # no flip, centred crop
    with pytest.raises(ValueError, match="uint8 images"):
        transform(images.float())
    body["data"] = {"train": {"name": "synthetic", "num_samples": 8}, "batch_size": 8}
    assert input_transform(RunSpec.model_validate(body)) is None  # no raw form to start from


def test_an_earlier_checkpoint_exports_on_request_and_the_final_one_matches_the_trainers_export(tmp_path):
    """``export_checkpoint`` (what a requested export runs on a worker) consolidates a committed
    DCP checkpoint: the final checkpoint gives bit for bit the trainer's own final export, and an
    earlier one gives that step's weights, loadable by ``load_model`` with surgery replayed."""
    from workers.checkpoint import Checkpointer, read_checkpoint
    from workers.export import export_checkpoint

    spec = digits_spec(max_duration="1ep", algorithms=[{"name": "blurpool"}],
                       checkpoint={"interval": "11ba", "keep_last": 3})
    run = run_url(f"file://{tmp_path}", "r1")
    train(spec, sink=MemorySink(), checkpoint_url=checkpoints_url(run))
    committed = [info for info in Checkpointer(checkpoints_url(run), fingerprint={}).checkpoints() if info.committed]
    first, last = committed[0], committed[-1]
    assert first.step < last.step

    final_path = export_url(run, last.step, "safetensors").removeprefix("file://")
    trainer_state, _ = read_export(open(final_path, "rb").read())
    urls = export_checkpoint(last.url, spec=spec)  # overwrites the same step with the consolidated checkpoint
    consolidated, metadata = read_export(open(urls["safetensors"].removeprefix("file://"), "rb").read())
    assert consolidated.keys() == trainer_state.keys()
    assert all(torch.equal(consolidated[k], trainer_state[k]) for k in trainer_state)

    urls = export_checkpoint(first.url, spec=spec, metrics={"eval/accuracy": 0.5})
    assert urls["safetensors"].endswith(f"step-{first.step}.safetensors")
    model = load_model(urls["torch"])
    assert any(type(m).__name__.lower().startswith("blur") for m in model.modules())
    expected = read_checkpoint(first.url)["model"]
    assert all(torch.equal(model.state_dict()[k], expected[k]) for k in expected)
    _, early = read_export(open(urls["safetensors"].removeprefix("file://"), "rb").read())
    assert early["tessera.step"] == str(first.step) and json.loads(early["tessera.metrics"]) == {"eval/accuracy": 0.5}


def test_the_safetensors_file_is_written_last_so_ready_means_both_formats(tmp_path, monkeypatch):
    """The service reads an export as READY once its .safetensors file exists (and a client then
    downloads either format): the .pt must already be there."""
    import workers.export as export

    written, storage_for = [], export.storage_for

    class Recording:
        def __init__(self, url):
            self.inner = storage_for(url)

        def write_bytes(self, url, data):
            written.append(url.rsplit(".", 1)[-1])
            self.inner.write_bytes(url, data)

    monkeypatch.setattr(export, "storage_for", Recording)
    urls = export.write_exports(f"file://{tmp_path}/runs/r1", {"w": torch.ones(2)}, {"tessera.step": "3"})
    assert written == ["pt", "safetensors"]
    assert read_export(open(urls["safetensors"].removeprefix("file://"), "rb").read())[0]["w"].tolist() == [1.0, 1.0]


def _watch_writes(storage, monkeypatch, on_write) -> None:
    """Call ``on_write(data)`` before each write to a file ``storage`` opens (it may raise)."""
    real_open = storage.fs.open

    class Watched:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def write(self, data):
            on_write(data)
            return self.file.write(data)

    monkeypatch.setattr(storage.fs, "open", lambda path, mode="rb", **kw: Watched(real_open(path, mode, **kw)))


def test_a_local_file_appears_whole_or_not_at_all(tmp_path, monkeypatch):
    """``write_bytes`` on local storage writes aside and renames: while the bytes go out, a reader
    of the path (the service reads an export's .safetensors as READY) finds no file, or the
    whole previous one."""
    from workers.checkpoint.storage import storage_for

    target = tmp_path / "runs" / "r1" / "exports" / "step-3.safetensors"
    storage = storage_for(f"file://{tmp_path}")
    seen_while_writing = []
    _watch_writes(storage, monkeypatch,
                  lambda data: seen_while_writing.append(target.read_bytes() if target.exists() else None))
    storage.write_bytes(f"file://{target}", b"weights")
    storage.write_bytes(f"file://{target}", b"new weights")
    assert seen_while_writing == [None, b"weights"] and target.read_bytes() == b"new weights"
    assert [p.name for p in target.parent.iterdir()] == ["step-3.safetensors"]  # nothing partial left


def test_a_failed_local_write_leaves_nothing_and_its_partial_is_named_apart(tmp_path, monkeypatch):
    """A write that fails midway leaves neither the file nor its partial (each retry would leave
    one, as large as a model); while it is written, the partial's name does not contain the
    file's (TensorBoard reads any file named like ``*tfevents*``)."""
    from workers.checkpoint.storage import storage_for

    folder = tmp_path / "tensorboard"
    storage = storage_for(f"file://{tmp_path}")
    names = []

    def disk_full(data):
        names.extend(p.name for p in folder.iterdir())
        raise OSError(28, "No space left on device")

    _watch_writes(storage, monkeypatch, disk_full)
    target = folder / "events.out.tfevents.1.host"
    with pytest.raises(OSError, match="No space left"):
        storage.write_bytes(f"file://{target}", b"events")
    assert len(names) == 1 and "tfevents" not in names[0] and names[0].endswith(".partial")
    assert list(folder.iterdir()) == []
