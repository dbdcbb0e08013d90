"""``tessera train`` without the service checkpoints as it goes, and running the same spec again
resumes from the newest committed checkpoint: in process, and across a killed CLI process. A DDP
run's private Ray leaves its caller's environment as it was."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.workers.checkpoint_helpers import assert_bitwise_equal, latest_url
from tests.workers.data_helpers import write_indexed_folder
from tests.workers.helpers_specs import tiny_spec
from workers.checkpoint import IncompatibleCheckpoint
from workers.local import environment_restored, latest_local_checkpoint, local_run_url, train_local
from workers.reporter import MemorySink


def spec_of(max_duration: str, **overrides):
    body = dict(name="local-resume", max_duration=max_duration, deterministic=True,
                checkpoint={"interval": "2ba", "keep_last": 3})
    body.update(overrides)
    return tiny_spec(**body)


def test_running_a_spec_again_resumes_where_the_last_local_run_ended(tmp_path):
    first = MemorySink()
    train_local(spec_of("4ba"), sink=first, checkpoint_dir=str(tmp_path))
    assert [step for step, _ in first.values("train/loss")] == [1, 2, 3, 4]
    assert latest_local_checkpoint(spec_of("4ba"), str(tmp_path)).step == 4
    assert local_run_url(spec_of("4ba"), str(tmp_path)) == f"file://{tmp_path}/runs/local-resume"

    longer = MemorySink()
    train_local(spec_of("6ba"), sink=longer, checkpoint_dir=str(tmp_path))
    assert [step for step, _ in longer.values("train/loss")] == [5, 6]

    fresh = MemorySink()  # without a checkpoint_dir (tessera train --no-checkpoints): from scratch, nothing saved
    train_local(spec_of("2ba"), sink=fresh)
    assert [step for step, _ in fresh.values("train/loss")] == [1, 2]
    assert latest_local_checkpoint(spec_of("2ba"), str(tmp_path)).step == 6


def test_tessera_train_of_a_spec_already_trained_to_its_end_says_there_is_nothing_left(tmp_path, monkeypatch):
    """Run again, a spec trained to its end answers at once, with neither a trainer nor, for a DDP
    spec, a private Ray (which took 30 s to start and stop on 2 cores): both say the same."""
    from typer.testing import CliRunner

    from cli.main import app
    from workers import local

    spec_file, ddp_file = tmp_path / "spec.json", tmp_path / "ddp.json"
    spec_file.write_text(spec_of("2ba").model_dump_json())
    ddp_file.write_text(spec_of("2ba", parallelism={"strategy": "ddp", "num_workers": 2}).model_dump_json())
    checkpoint_dir = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    first = CliRunner().invoke(app, ["train", str(spec_file), *checkpoint_dir])
    assert first.exit_code == 0 and "nothing left to train" not in first.output, first.output
    final = json.loads(first.stdout[first.stdout.rindex("\n{"):])

    def started(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(local, "train", started)
    monkeypatch.setattr(local, "_train_with_local_ray", started)
    again = CliRunner().invoke(app, ["train", str(spec_file), *checkpoint_dir])
    assert again.exit_code == 0, again.output
    assert "resuming from" in again.stdout and "(batch 2)" in again.stdout
    assert ("nothing left to train: the run's newest checkpoint is at batch 2, at or past max_duration 2ba; "
            "--set max_duration=... trains on from it") in " ".join(again.stderr.split())
    assert json.loads(again.stdout[again.stdout.rindex("\n{"):]) == {
        "eval/loss": final["eval/loss"], "eval/accuracy": final["eval/accuracy"], "checkpoint/final_saved": 1.0}
    ddp = CliRunner().invoke(app, ["train", str(ddp_file), *checkpoint_dir])
    assert (ddp.exit_code, ddp.stdout, ddp.stderr) == (0, again.stdout, again.stderr), ddp.output


def test_only_a_run_trained_to_its_end_under_what_decides_the_end_counts_as_finished(tmp_path):
    """``finished_local_run`` answers only when a resume would surely train nothing; else the
    trainer decides as before (a longer run trains on, another model is refused)."""
    from workers.local import finished_local_run

    ckpt = str(tmp_path)
    train_local(spec_of("4ba", checkpoint={"interval": "1ba", "keep_last": 5}), sink=MemorySink(), checkpoint_dir=ckpt)
    step, metrics = finished_local_run(spec_of("4ba"), ckpt)
    assert step == 4 and set(metrics) == {"eval/loss", "eval/accuracy", "checkpoint/final_saved"}
    # Neither its parallelism nor its loggers, name aside, move the end; the duration and model do.
    assert finished_local_run(spec_of("4ba", parallelism={"strategy": "fsdp", "num_workers": 2},
                                      tags=["again"], max_restarts=2), ckpt) == (step, metrics)
    assert finished_local_run(spec_of("5ba"), ckpt) is None
    assert finished_local_run(spec_of("1ep"), ckpt) is None  # 4 batches too, but the trainer counts them
    assert finished_local_run(spec_of("4ba", model={"name": "simple_cnn", "params": {"width": 16}}), ckpt) is None
    assert finished_local_run(spec_of("4ba", name="never-trained"), ckpt) is None
    # The user's own code can change under the same spec: a run that imports it is the trainer's to decide,
    # even with an export of that very spec.
    own_model = spec_of("4ba", model={"import": "my_project.nets:build"})
    own_data = spec_of("4ba", data={**spec_of("4ba").data.model_dump(by_alias=True),
                                    "train": {"import": "my_project.data:train_set"},
                                    "eval": {"import": "my_project.data:test_set"}})
    for imports in (own_model, own_data):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("workers.local._safetensors_metadata",
                          lambda url, spec=imports: {"tessera.spec": spec.model_dump_json(), "tessera.metrics": "{}"})
            assert finished_local_run(imports, ckpt) is None

    # A run stopped in its final evaluation has its final checkpoint but no export: it is not finished.
    run = tmp_path / "runs" / "local-resume"
    for export in (run / "exports").iterdir():
        export.unlink()
    assert finished_local_run(spec_of("4ba"), ckpt) is None
    (run / "exports" / "step-4.safetensors").write_bytes(b"\xff" * 16)  # not safetensors: the trainer decides
    assert finished_local_run(spec_of("4ba"), ckpt) is None
    sink = MemorySink()
    assert train_local(spec_of("4ba"), sink=sink, checkpoint_dir=ckpt)["eval/accuracy"] == metrics["eval/accuracy"]
    assert finished_local_run(spec_of("4ba"), ckpt) == (step, metrics)  # exported again
    # An older checkpoint than the export: what a resume from it would train is the trainer's to say.
    for name in ("ep1-ba4", "ep0-ba3"):
        shutil.rmtree(run / "checkpoints" / name)
    assert latest_local_checkpoint(spec_of("4ba"), ckpt).step == 2 and finished_local_run(spec_of("4ba"), ckpt) is None


def folder_spec(root: Path, max_duration: str):
    """``spec_of`` over the image folder at ``root``, for training and evaluation, read in this process."""
    folder = {"name": "image_folder", "root": str(root), "channels": 1, "num_workers": 0}
    return spec_of(max_duration, data={"train": folder, "eval": folder, "batch_size": 8})


def test_an_epoch_duration_over_an_image_folder_that_gained_files_trains_again(tmp_path):
    """An epoch of an image folder ends where its files say: the same spec over a folder that gained
    images ends later, and the trainer, not the export of the shorter run, decides what is left."""
    root, ckpt = tmp_path / "images", str(tmp_path / "ckpt")
    write_indexed_folder(root, 16, num_classes=2)
    first = MemorySink()
    train_local(folder_spec(root, "1ep"), sink=first, checkpoint_dir=ckpt)
    assert [step for step, _ in first.values("train/loss")] == [1, 2]
    write_indexed_folder(root, 32, num_classes=2)  # 16 more images: 4 batches an epoch
    again = MemorySink()
    final = train_local(folder_spec(root, "1ep"), sink=again, checkpoint_dir=ckpt)
    assert [step for step, _ in again.values("train/loss")] == [3, 4] and final["time/batch"] == 4
    assert latest_local_checkpoint(folder_spec(root, "1ep"), ckpt).step == 4


def test_a_batch_duration_over_an_image_folder_that_gained_files_answers_from_its_export(tmp_path, monkeypatch):
    """A duration in batches ends where the spec says, whatever the folder holds: answered at once."""
    from workers import local

    root, ckpt = tmp_path / "images", str(tmp_path / "ckpt")
    write_indexed_folder(root, 16, num_classes=2)
    first = train_local(folder_spec(root, "3ba"), sink=MemorySink(), checkpoint_dir=ckpt)
    write_indexed_folder(root, 32, num_classes=2)
    monkeypatch.setattr(local, "train", lambda *args, **kwargs: pytest.fail("trained again"))
    again = train_local(folder_spec(root, "3ba"), sink=MemorySink(), checkpoint_dir=ckpt)
    assert again == {"eval/loss": first["eval/loss"], "eval/accuracy": first["eval/accuracy"],
                     "checkpoint/final_saved": 1.0}


def _data(train: dict, **eval_overrides) -> dict:
    return {"train": train, "eval": {**train, **eval_overrides}, "batch_size": 16}


WEBDATASET = {"name": "webdataset", "urls": "/data/shard-{0..3}.tar", "num_samples": 64, "num_classes": 4}


@pytest.mark.parametrize(("max_duration", "data", "answered"), [
    ("3ep", None, True),  # tiny_spec's synthetic set: its size is the spec's num_samples
    ("3ep", _data({"name": "digits", "image_size": 8}, split="test"), True),
    ("3ep", _data({"name": "fashion_mnist"}, split="test"), True),  # Debian's files: a fixed size
    ("3ep", _data({"name": "fashion_mnist", "root": "/data/my-mnist"}, split="test"), False),  # whatever is there
    ("3ep", _data(WEBDATASET), True),  # num_samples // batch_size batches an epoch
    ("3ep", _data({"name": "image_folder", "root": "/data/images"}), False),
    ("12ba", _data({"name": "image_folder", "root": "/data/images"}), True),
    ("192sp", _data({"name": "image_folder", "root": "/data/images"}), True),
], ids=["synthetic", "digits", "fashion_mnist", "fashion_mnist_elsewhere", "webdataset", "image_folder_ep",
        "image_folder_ba", "image_folder_sp"])
def test_an_unchanged_spec_is_answered_from_its_export_only_where_the_spec_fixes_its_end(tmp_path, monkeypatch,
                                                                                      max_duration, data, answered):
    from workers import local

    spec = spec_of(max_duration, **({"data": data} if data else {}))
    monkeypatch.setattr(local, "latest_local_checkpoint", lambda *args: type("Latest", (), {"step": 12})())
    monkeypatch.setattr(local, "_safetensors_metadata",
                        lambda url: {"tessera.spec": spec.model_dump_json(), "tessera.metrics": '{"eval/loss": 0.5}'})
    expected = (12, {"eval/loss": 0.5, "checkpoint/final_saved": 1.0}) if answered else None
    assert local.finished_local_run(spec, str(tmp_path)) == expected


def test_a_finished_run_trained_again_reports_its_final_metrics_to_the_sink_without_a_logger_s_run(tmp_path,
                                                                                                   monkeypatch):
    from workers import local

    first = train_local(spec_of("2ba"), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    monkeypatch.setattr(local, "with_loggers", lambda *args, **kwargs: pytest.fail("a logger's run was started"))
    sink = MemorySink()
    again = train_local(spec_of("2ba"), sink=sink, checkpoint_dir=str(tmp_path))
    assert again == {"eval/loss": first["eval/loss"], "eval/accuracy": first["eval/accuracy"],
                     "checkpoint/final_saved": 1.0}
    assert sink.points == [(2, key, value) for key, value in again.items()] and sink.closed


def test_a_spec_with_another_model_under_the_same_name_is_refused(tmp_path):
    train_local(spec_of("2ba"), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    other = spec_of("4ba", model={"name": "simple_cnn", "params": {"width": 16, "hidden": 16}})
    try:
        train_local(other, sink=MemorySink(), checkpoint_dir=str(tmp_path))
    except IncompatibleCheckpoint as exc:
        assert "incompatible run" in str(exc)
    else:
        raise AssertionError("the checkpoint of another model was loaded")


def test_the_cli_resumes_a_killed_run_and_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path):
    spec = spec_of("8ba")
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    command = [sys.executable, "-m", "cli.main", "train", str(spec_file), "--checkpoint-dir", str(tmp_path / "ckpt")]
    env = {**os.environ, "TESSERA_TEST_KILL_AT_BATCH": "5", "TESSERA_TEST_KILL_MARKER": str(tmp_path / "killed")}

    killed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILLed after batch 5; 2 and 4 committed
    assert "checkpoints go to" in killed.stdout
    resumed = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from file://{tmp_path}/ckpt/runs/local-resume/checkpoints/ep1-ba4 (batch 4)" in resumed.stdout
    metrics = json.loads(resumed.stdout[resumed.stdout.rindex("\n{"):])
    assert metrics["time/batch"] == 8

    train_local(spec, sink=MemorySink(), checkpoint_dir=str(tmp_path / "whole"))
    resumed_url = f"file://{tmp_path}/ckpt/runs/local-resume/checkpoints"
    whole_url = f"file://{tmp_path}/whole/runs/local-resume/checkpoints"
    assert latest_url(resumed_url).endswith("ba8") and latest_url(whole_url).endswith("ba8")
    assert_bitwise_equal(latest_url(resumed_url), latest_url(whole_url))


@pytest.mark.integration
def test_a_ddp_spec_run_again_resumes_through_ray_without_reporting_a_restart(ray_client, tmp_path):
    body = dict(parallelism={"strategy": "ddp", "num_workers": 2})
    train_local(spec_of("4ba", **body), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    assert latest_local_checkpoint(spec_of("4ba", **body), str(tmp_path)).step == 4
    final = train_local(spec_of("6ba", **body), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    assert final["time/batch"] == 6
    assert latest_local_checkpoint(spec_of("6ba", **body), str(tmp_path)).name == "ep1-ba6"
    # Once more: trained to its end, it answers from the export its ranks wrote, starting no attempt.
    again = train_local(spec_of("6ba", **body), sink=MemorySink(), checkpoint_dir=str(tmp_path))
    assert again == {"eval/loss": final["eval/loss"], "eval/accuracy": final["eval/accuracy"],
                     "checkpoint/final_saved": 1.0}
    # Each invocation is its own attempt: the second is not a Ray Train restart of the first.
    assert sorted(os.listdir(tmp_path / "runs" / "local-resume" / "attempts")) == ["1.started", "2.started"]


# Left out of a child's environment: what a local train's Ray sets in its process (this one's has
# them from conftest and ray_client), and RAY_ADDRESS, which would make it join this session's Ray.
RAY_SETS = ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_ADDRESS", "RAY_CLIENT_MODE", "PYTHONBREAKPOINT")

# ``tessera train ARGS...`` through the console script's entry (cli.main.main), in this process, so
# that what the run did to its caller's environment can be read after it: writes the exit status and
# the variables that differ from before to the file named first.
TRAIN_IN_THIS_PROCESS = """
import json, os, sys
import ray  # its import sets RAY_CLIENT_MODE=0 for good, before any run: the module's, not a run's
from cli.main import main

seen_file = sys.argv.pop(1)  # the rest is tessera train's command line
before = dict(os.environ)
try:
    main()
    status = 0
except SystemExit as exc:  # click ends a command that returned with sys.exit(0)
    status = exc.code
changed = sorted(k for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k))
with open(seen_file, "w") as out:
    json.dump([status, changed], out)
"""


@pytest.mark.integration
def test_tessera_train_of_a_ddp_spec_beside_another_ray_cluster_starts_its_own_and_leaves_its_caller_as_it_was(
        ray_head, tmp_path):
    """One DDP ``tessera train`` with a private Ray (30 s on 2 cores) checks two things.

    The README's tour runs ``tessera train`` of a DDP spec while the service's Ray (here the
    session's ``ray_head``) runs: the train starts a Ray of its own, and Ray Train's
    placement-group cleaner, which looks the cluster up again, found two and printed "Found
    multiple active Ray instances", a traceback amid the train's output.

    ``train_local``, under the CLI, leaves its caller's environment as it was: a notebook that
    trains a DDP spec goes on neither with ``RAY_AUTH_MODE=disabled`` (set for the private Ray)
    for its own Ray later, nor with what ``ray.init`` sets (``PYTHONBREAKPOINT`` to Ray's
    debugger). Read in a process of its own, which has none of Ray's variables to begin with
    (``RAY_SETS``): this one's has them already, so a run that set them again would change nothing."""
    spec_file, seen_file = tmp_path / "spec.json", tmp_path / "seen.json"
    spec_file.write_text(spec_of("3ba", parallelism={"strategy": "ddp", "num_workers": 2}).model_dump_json())
    env = {key: value for key, value in os.environ.items() if key not in RAY_SETS}
    trained = subprocess.run([sys.executable, "-c", TRAIN_IN_THIS_PROCESS, str(seen_file),
                              "train", str(spec_file), "--no-checkpoints"],
                             cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-3000:]
    assert json.loads(seen_file.read_text()) == [0, []], output[-3000:]  # exit status 0, no variable changed
    assert json.loads(trained.stdout[trained.stdout.rindex("\n{"):])["time/batch"] == 3
    assert "multiple active Ray instances" not in output and "Traceback" not in output, output[-3000:]


def test_the_environment_is_restored_when_the_run_raises_too(monkeypatch):
    monkeypatch.setenv("TESSERA_KEPT", "as it was")
    monkeypatch.delenv("TESSERA_ADDED", raising=False)
    with pytest.raises(RuntimeError), environment_restored():
        os.environ["TESSERA_KEPT"] = "changed"
        os.environ["TESSERA_ADDED"] = "added"
        raise RuntimeError("the ranks refused the checkpoint")
    assert os.environ["TESSERA_KEPT"] == "as it was" and "TESSERA_ADDED" not in os.environ


@pytest.mark.parametrize("code", [0, 1, signal.SIGTERM], ids=["ray-train-sigint", "via-ray-get", "ray-init-sigterm"])
def test_a_system_exit_out_of_a_fit_on_ray_is_the_interrupt_it_stands_for(monkeypatch, code):
    """Ray Train's SIGINT handler ``sys.exit(0)``s, which Ray's core worker raises as SystemExit(1)
    out of ``ray.get``: ``tessera train`` ended with status 1 and no word. ``ray.init``'s SIGTERM
    handler, in a process that connected its own Ray, ``sys.exit(signum)``s (ray/_private/worker.py:
    1675-1676). The run's MLflow runs end as interrupted (KILLED), not FAILED."""
    from workers import local, ray_train

    def fit_with_ray(spec, **_):
        raise SystemExit(code)

    ended = []
    monkeypatch.setattr(ray_train, "fit_with_ray", fit_with_ray)
    monkeypatch.setattr(local, "end_interrupted_mlflow_runs", lambda *_, **__: ended.append("interrupted"))
    monkeypatch.setattr(local, "end_failed_mlflow_runs", lambda *_, **__: ended.append("failed"))
    with pytest.raises(KeyboardInterrupt) as raised:
        local._fit_on_ray(spec_of("2ba"), MemorySink(), None, shut_down=False)
    assert isinstance(raised.value.__cause__, SystemExit) and ended == ["interrupted"]


def test_ctrl_c_on_tessera_train_says_which_checkpoint_it_kept_and_exits_130(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from cli.main import app
    from cli.output import EXIT_INTERRUPTED
    from workers import local

    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec_of("2ba").model_dump_json())
    command = ["train", str(spec_file), "--checkpoint-dir", str(tmp_path / "ckpt")]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    real_train = local.train
    monkeypatch.setattr(local, "train", interrupted)  # Ctrl-C before a checkpoint
    fresh = CliRunner().invoke(app, command)
    assert fresh.exit_code == EXIT_INTERRUPTED, fresh.output
    assert fresh.stderr.strip() == "interrupted; no checkpoint was saved: training again starts afresh"

    monkeypatch.setattr(local, "train", real_train)
    assert CliRunner().invoke(app, command).exit_code == 0  # saves ep0-ba2
    monkeypatch.setattr(local, "train", interrupted)
    kept = CliRunner().invoke(app, [*command, "--set", "max_duration=4ba"])  # 2ba: trained to its end, no train
    assert kept.exit_code == EXIT_INTERRUPTED, kept.output
    url = f"file://{tmp_path}/ckpt/runs/local-resume/checkpoints/ep0-ba2"
    assert " ".join(kept.stderr.split()) == (f"interrupted; kept checkpoint {url} (batch 2): "
                                             "the same tessera train command resumes from it")

    nothing = CliRunner().invoke(app, ["train", str(spec_file), "--no-checkpoints"])
    assert nothing.exit_code == EXIT_INTERRUPTED
    assert nothing.stderr.strip() == "interrupted; nothing was saved (--no-checkpoints)"


@pytest.mark.parametrize("when", ["as-ray-starts", "as-it-trains"])
def test_sigterm_on_a_ddp_tessera_train_exits_130_saying_what_it_kept(tmp_path, monkeypatch, when):
    """``kill PID`` (a batch scheduler's end of the job) on a DDP ``tessera train`` stops it as
    Ctrl-C does, with Ray faked: as its private Ray starts (where ``ray.init``'s own SIGTERM
    handler, which it sets first, ended it with status 15 and no word, and left Ray's agents
    running), and once Ray runs (its handlers put back: the CLI's turns SIGTERM into the interrupt)."""
    import sys

    import ray
    import ray._private.utils as ray_utils
    from typer.testing import CliRunner

    from cli.main import app
    from cli.output import EXIT_INTERRUPTED
    from workers import local, ray_train

    seen = []

    def ray_starts(spec, temp_dir):
        def ray_s(signum, frame):  # ray/_private/worker.py:1675-1676
            sys.exit(signum)

        ray_utils.set_sigterm_handler(ray_s)  # ray.init's first step
        if when == "as-ray-starts":
            os.kill(os.getpid(), signal.SIGTERM)
        seen.append("started")

    def fit_with_ray(spec, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        seen.append("trained on")

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # the private Ray's folder, made and removed
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append("shut down"))
    monkeypatch.setattr(local, "_start_private_ray", ray_starts)
    monkeypatch.setattr(ray_train, "fit_with_ray", fit_with_ray)
    monkeypatch.setattr(local, "end_interrupted_mlflow_runs", lambda *_, **__: seen.append("mlflow killed"))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec_of("4ba", parallelism={"strategy": "ddp", "num_workers": 2}).model_dump_json())
    sigterm_before = signal.getsignal(signal.SIGTERM)
    stopped = CliRunner().invoke(app, ["train", str(spec_file), "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert (stopped.exit_code, stopped.stderr.strip()) == (
        EXIT_INTERRUPTED, "interrupted; no checkpoint was saved: training again starts afresh"), stopped.output
    assert seen == (["started", "shut down"] if when == "as-ray-starts" else ["started", "shut down", "mlflow killed"])
    assert signal.getsignal(signal.SIGTERM) is sigterm_before
    assert [path.name for path in tmp_path.iterdir()] == ["spec.json"]


@pytest.mark.integration
def test_ctrl_c_on_a_ddp_tessera_train_exits_130_keeping_its_checkpoint_and_leaves_nothing_behind(tmp_path):
    """Ctrl-C on a DDP ``tessera train`` ended with status 1 and no word; its private Ray printed
    Ray Train's "Failed to query Ray Train Controller actor state" every second, and left
    ``/tmp/ray/session_*`` and the ranks' ``/tmp/pymp-*`` folders behind. Here Ray's temporary
    folder and the processes' TMPDIR are this test's, to be found empty afterwards."""
    short = Path(tempfile.mkdtemp(prefix="tl-", dir="/tmp"))  # Ray's socket paths must fit 107 bytes
    try:
        _ctrl_c_a_ddp_train(tmp_path, ray_tmp=short / "r", tmp=short / "t")
    finally:
        shutil.rmtree(short)


def _ctrl_c_a_ddp_train(tmp_path: Path, *, ray_tmp: Path, tmp: Path) -> None:
    ray_tmp.mkdir()
    tmp.mkdir()
    spec = spec_of("100000ba", name="local-ctrl-c", parallelism={"strategy": "ddp", "num_workers": 2})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(spec.model_dump_json())
    # torch.compile's cache is made as torch._dynamo is imported, in $TMPDIR unless TORCHINDUCTOR_CACHE_DIR says
    # where (torch/_inductor/runtime/cache_dir_utils.py): the user's, kept on purpose. Named here, as this
    # process's import of torch._dynamo, if any ran before, named it for the child.
    env = {**{key: value for key, value in os.environ.items() if key not in RAY_SETS},
           "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor")}
    command = [sys.executable, "-m", "cli.main", "train", str(spec_file), "--checkpoint-dir", str(tmp_path / "ckpt")]
    train = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        seen = []
        for line in train.stdout:  # until rank 0 has committed a checkpoint
            seen.append(line)
            if " committed (" in line:
                break
        else:
            raise AssertionError("".join(seen)[-3000:])
        train.send_signal(signal.SIGINT)
        rest, _ = train.communicate(timeout=120)
    finally:
        if train.poll() is None:
            train.kill()
    output = "".join(seen) + rest
    assert train.returncode == 130, output[-3000:]
    latest = latest_local_checkpoint(spec, str(tmp_path / "ckpt"))
    assert output.rstrip().splitlines()[-1] == (f"interrupted; kept checkpoint {latest.url} (batch {latest.step}): "
                                                "the same tessera train command resumes from it")
    assert "Failed to query Ray Train Controller actor state" not in output
    assert os.listdir(ray_tmp) == [] and os.listdir(tmp) == []
    assert _running_in_session(train.pid) == []


def _running_in_session(session: int) -> list[str]:
    """The processes of ``session`` that are not zombies, once Ray's have had 30 s to exit."""
    deadline = time.monotonic() + 30
    while True:
        listed = subprocess.run(["ps", "-o", "stat=,args=", "-s", str(session)], capture_output=True, text=True)
        running = [line for line in listed.stdout.splitlines() if not line.lstrip().startswith("Z")]
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.5)
