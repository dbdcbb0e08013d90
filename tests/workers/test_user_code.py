"""Your own model in a worker: fetch and verify the package, import, build, its loss, and the
run-visible notes of surgery that found nothing to change."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from api.code_package import pack_directory
from api.model_specs import CodeRef, ImportedModelSpec
from api.specs import RunSpec
from workers.models import code_cache, user_code
from workers.models.user_code import UserCodeError, install_code
from workers.reporter import MemorySink
from workers.trainer import Trainer
from tests.workers.byo_helpers import store, user_spec, write_user_package


@pytest.fixture
def fresh_imports(tmp_path, monkeypatch):
    """A private code cache, and the test packages forgotten before and after the test."""
    monkeypatch.setenv("TESSERA_CODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in sys.modules if n.split(".")[0] in ("my_project", "my_lm")]:
        del sys.modules[name]
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("my_project", "my_lm")]:
        del sys.modules[name]


def test_a_shipped_model_trains_with_its_own_loss_and_surgery_that_finds_nothing_is_noted(tmp_path, fresh_imports):
    package = pack_directory(write_user_package(tmp_path / "src"))
    assert "my_project/old.ckpt" not in package.files
    folder = install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    assert (folder / "my_project" / "nets.py").is_file() and sys.path[0] == str(folder)
    spec = RunSpec.model_validate(user_spec("byo", package.digest, algorithms=[
        {"name": "blurpool"}, {"name": "channels_last"}, {"name": "factorize"}]))
    trainer = Trainer(spec, sink=MemorySink())
    assert type(trainer.state.model).__name__ == "TinyMLP"
    assert [note.split(" ")[0] for note in trainer.surgery_notes] == ["BlurPool", "ChannelsLast", "Factorize"]
    trainer.fit()
    import my_project.nets

    assert my_project.nets.LOSS_CALLS[:4] == [(16, 4)] * 4  # the model's loss, not the default one


def test_a_package_whose_bytes_differ_from_its_digest_is_refused(tmp_path, fresh_imports):
    package = pack_directory(write_user_package(tmp_path / "src"))
    storage_url = store(tmp_path, package)
    (tmp_path / "storage" / "code" / f"{package.digest}.zip").write_bytes(package.data + b"tampered")
    with pytest.raises(UserCodeError, match="holds other bytes"):
        install_code(CodeRef(digest=package.digest), storage_url=storage_url)
    with pytest.raises(UserCodeError, match=r"cannot fetch .*/code/0{64}\.zip: FileNotFoundError"):
        install_code(CodeRef(digest="0" * 64), storage_url=storage_url)


def test_a_folder_in_the_cache_counts_only_if_this_process_unpacked_and_checked_it(tmp_path, fresh_imports):
    """Someone's folder under a digest's name (a planted one, an older cache's) is unpacked again
    from checked bytes, never imported as it is."""
    package = pack_directory(write_user_package(tmp_path / "src"))
    (tmp_path / "cache").mkdir(mode=0o700)  # private whatever the umask: the cache must be
    planted = tmp_path / "cache" / package.digest / "my_project"
    planted.mkdir(parents=True)
    (planted / "__init__.py").write_text("raise RuntimeError('planted code ran')\n")
    fetched = []

    def fetch():
        fetched.append(1)
        return package.data, "the test"

    folder = install_code(CodeRef(digest=package.digest), storage_url=None, fetch=fetch)
    assert fetched == [1] and (folder / "my_project" / "nets.py").is_file()
    import my_project.nets  # noqa: F401  (the package's own code, not the planted __init__)

    assert install_code(CodeRef(digest=package.digest), storage_url=None, fetch=fetch) == folder and fetched == [1]


def test_a_cache_others_can_write_to_is_refused_and_a_loose_package_folder_unpacked_again(tmp_path, fresh_imports):
    """The marker alone proves nothing where others can write: a package folder counts only if it
    is this user's and private, and so must the cache be."""
    package = pack_directory(write_user_package(tmp_path / "src"))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)  # private whatever the umask: the cache must be
    planted = cache / package.digest
    (planted / "evil").mkdir(parents=True)
    (planted / "evil" / "__init__.py").write_text("PLANTED = True\n")
    (planted / code_cache.VERIFIED_MARKER).write_text(package.digest)
    planted.chmod(0o777)
    fetched = []
    folder = install_code(CodeRef(digest=package.digest), storage_url=None, fetch=lambda: fetched.append(1) or (package.data, "t"))
    assert fetched == [1] and not (folder / "evil").exists() and (folder / "my_project" / "nets.py").is_file()
    cache.chmod(0o777)
    with pytest.raises(UserCodeError, match="can be written by other users .*chmod 700"):
        install_code(CodeRef(digest=package.digest), storage_url=None, fetch=lambda: (package.data, "t"))


def test_a_code_cache_of_another_user_is_refused(tmp_path, fresh_imports, monkeypatch):
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(code_cache.os, "getuid", lambda: (tmp_path / "cache").stat().st_uid + 1)
    with pytest.raises(UserCodeError, match="belongs to another user .*TESSERA_CODE_CACHE"):
        install_code(CodeRef(digest="0" * 64), storage_url="file:///nowhere")


def test_the_default_code_cache_is_this_users_and_private(tmp_path, monkeypatch):
    monkeypatch.delenv("TESSERA_CODE_CACHE", raising=False)
    monkeypatch.setattr(code_cache.tempfile, "gettempdir", lambda: str(tmp_path))
    root = code_cache.own_cache(code_cache.code_cache_dir())
    assert root == tmp_path / f"tessera-code-{code_cache.os.getuid()}" and root.stat().st_mode & 0o077 == 0


def test_an_import_error_names_the_module_the_error_and_the_users_line(tmp_path, fresh_imports):
    package = pack_directory(write_user_package(tmp_path / "src", broken=True))
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    spec = RunSpec.model_validate(user_spec("broken", package.digest))
    with pytest.raises(UserCodeError) as caught:
        Trainer(spec)
    message = str(caught.value)
    assert "model.import 'my_project.nets:build': importing module 'my_project.nets' failed" in message
    assert "ModuleNotFoundError: No module named 'not_installed_anywhere'" in message
    assert "my_project/nets.py\", line 1" in message and "import not_installed_anywhere" in message
    assert "tessera submit --code" not in message  # the package is there; one of its own imports failed


def test_an_import_of_a_package_the_run_did_not_send_says_how_to_send_it():
    from api.model_specs import ImportedModelSpec
    from workers.models.user_code import load_callable

    with pytest.raises(UserCodeError) as caught:
        load_callable(ImportedModelSpec.model_validate({"import": "my_unsent_project.nets:build"}))
    assert "No module named 'my_unsent_project'" in str(caught.value)
    assert str(caught.value).endswith("'my_unsent_project' is neither in the run's code package nor installed on the "
                                      "workers: send your code with the run (tessera submit --code DIR, or "
                                      "code.digest), or install it on the workers")


def test_a_callable_the_module_lacks_is_named_with_the_closest_public_name(tmp_path, fresh_imports):
    from api.data_specs import ImportedDataSpec

    package = pack_directory(write_user_package(tmp_path / "src"))
    folder = install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = user_spec("typo", package.digest)
    body["model"]["import"] = "my_project.nets:biuld"
    with pytest.raises(UserCodeError) as caught:
        Trainer(RunSpec.model_validate(body))
    assert str(caught.value) == (f"model.import 'my_project.nets:biuld': 'biuld' does not exist in "
                                 f"{folder / 'my_project' / 'nets.py'}; did you mean 'build'?")
    data = ImportedDataSpec.model_validate({"import": "my_project.data:train_sett"})
    with pytest.raises(UserCodeError, match=r"^data.train.import 'my_project.data:train_sett': 'train_sett' does not "
                                            r"exist in .*my_project/data.py; did you mean 'train_set'\?$"):
        user_code.load_callable(data, field="data.train.import")
    with pytest.raises(UserCodeError, match=r"'_private_thing' does not exist in .*my_project/nets.py$"):  # none close
        user_code.load_callable(ImportedModelSpec.model_validate({"import": "my_project.nets:_private_thing"}))


def traceback_files(message: str) -> list[tuple[str, int]]:
    """The ``(file, line)`` of each frame in an error's "Traceback (last frames)" tail."""
    tail = message.partition("Traceback (last frames):")[2]
    return [(file, int(line)) for file, line in re.findall(r'File "([^"]+)", line (\d+)', tail)]


def test_a_traceback_tail_shows_the_users_frames_not_the_loaders(tmp_path, fresh_imports):
    """importlib's frames (frozen, and importlib/__init__.py's import_module) and Tessera's own
    loader's are left out: the tail ends, and here consists, in the user's own lines."""
    root = tmp_path / "src" / "my_project"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "at_import.py").write_text("WIDTH = 8\nHIDDEN = WIDTHH * 2\n")
    (root / "nets.py").write_text("def helper(width):\n    return widht\n\n\n"
                                  "def build(num_classes, in_channels, width=8):\n    return helper(width)\n")
    (root / "syntax.py").write_text("def build(:\n")
    package = pack_directory(root)
    folder = install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    own = folder / "my_project"

    with pytest.raises(UserCodeError) as at_import:
        user_code.load_callable(ImportedModelSpec.model_validate({"import": "my_project.at_import:build"}))
    message = str(at_import.value)
    assert "importing module 'my_project.at_import' failed: NameError: name 'WIDTHH' is not defined" in message
    assert traceback_files(message) == [(str(own / "at_import.py"), 2)]
    assert "HIDDEN = WIDTHH * 2" in message

    with pytest.raises(UserCodeError) as in_build:
        user_code.call_user(ImportedModelSpec.model_validate({"import": "my_project.nets:build"}),
                            {"num_classes": 4, "in_channels": 1})
    message = str(in_build.value)
    assert "calling it with num_classes=4, in_channels=1 failed: NameError: name 'widht' is not defined" in message
    assert traceback_files(message) == [(str(own / "nets.py"), 6), (str(own / "nets.py"), 2)]

    # The call itself failed (a parameter build does not take): no frames, only Tessera's would show.
    with pytest.raises(UserCodeError) as bad_call:
        user_code.call_user(ImportedModelSpec.model_validate({"import": "my_project.nets:build"}),
                            {"num_classes": 4, "in_channels": 1, "depth": 3})
    message = str(bad_call.value)
    assert message.endswith("failed: TypeError: build() got an unexpected keyword argument 'depth'"), message
    # A module that is nowhere: importlib's lines would only point away from the hint that follows.
    with pytest.raises(UserCodeError) as nowhere:
        user_code.load_callable(ImportedModelSpec.model_validate({"import": "not_shipped.nets:build"}))
    assert "Traceback" not in str(nowhere.value) and "neither in the run's code package" in str(nowhere.value)

    # Nothing of the user's ran (compiling failed): the frames are kept as they were.
    with pytest.raises(UserCodeError) as syntax:
        user_code.load_callable(ImportedModelSpec.model_validate({"import": "my_project.syntax:build"}))
    assert "SyntaxError" in str(syntax.value) and traceback_files(str(syntax.value))


def test_a_builder_that_does_not_return_a_module_is_refused(tmp_path, fresh_imports):
    root = tmp_path / "src" / "my_project"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "nets.py").write_text("def build(num_classes, in_channels, width):\n    return 'a string'\n")
    package = pack_directory(root)
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    spec = RunSpec.model_validate(user_spec("not-a-module", package.digest))
    with pytest.raises(UserCodeError, match="returned a str, not a torch.nn.Module"):
        Trainer(spec)
    assert code_cache.code_cache_dir() == tmp_path / "cache"


def test_the_readme_example_packs_validates_and_builds(tmp_path, fresh_imports):
    import yaml

    from tests.conftest import REPO_ROOT

    example = REPO_ROOT / "examples" / "byo"
    package = pack_directory(example / "my_project")
    assert package.files == ["my_project/.gitignore", "my_project/__init__.py", "my_project/corpus.txt",
                             "my_project/metrics.py", "my_project/nets.py", "my_project/text.py"]
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = yaml.safe_load((example / "spec.yaml").read_text())
    spec = RunSpec.model_validate({**body, "code": {"digest": package.digest},
                                   "parallelism": {"strategy": "none", "num_workers": 1}, "max_duration": "1ba"})
    trainer = Trainer(spec)
    assert type(trainer.state.model).__name__ == "SmallConvNet" and trainer.surgery_notes == []
    assert trainer.state.loss_fn.__func__.__qualname__ == "SmallConvNet.loss"
    # Its eval metrics, the package's own pr_auc among them, on digits' 10 classes.
    final = trainer.fit()
    assert 0.0 <= final["eval/f1_macro"] <= 1.0 and 0.0 < final["eval/pr_auc"] <= 1.0
    from my_project.metrics import errors_per_class, fbeta, pr_auc  # called as the workers call them

    logits, labels = torch.eye(3)[[0, 1, 1]], torch.tensor([0, 1, 2])
    assert errors_per_class(logits, labels) == {"errors_0": 0, "errors_1": 0, "errors_2": 1}
    assert fbeta(logits, labels, beta=2.0) == pytest.approx((1 + 5 / 6) / 3)  # class 1: P 1/2, R 1; class 2: 0
    # A class absent from the split has no curve: left out, not scored 0 (perfect scores stay 1).
    assert pr_auc(torch.eye(3)[[0, 1]] * 5, torch.tensor([0, 1])) == pytest.approx(1.0)


def test_the_readme_text_example_trains_a_language_model_on_the_packages_corpus(tmp_path, fresh_imports):
    """examples/byo/text_spec.yaml: the package's own characters as token windows (task
    language_model), the vocabulary from the data set's num_classes, tokens counted."""
    import yaml

    from tests.conftest import REPO_ROOT

    example = REPO_ROOT / "examples" / "byo"
    package = pack_directory(example / "my_project")
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = yaml.safe_load((example / "text_spec.yaml").read_text())
    spec = RunSpec.model_validate({**body, "code": {"digest": package.digest}, "max_duration": "6ba"})
    trainer = Trainer(spec)
    vocabulary = len(set((example / "my_project" / "corpus.txt").read_text()))
    assert trainer.state.num_classes == vocabulary
    metrics = trainer.fit()
    # Tokens trained on: seq_length_warmup starts the windows short (8, growing by 8 a step).
    assert 6 * 16 * 8 <= trainer.state.timestamp.token < 6 * 16 * 64
    # A uniform guess over the 39 characters scores 39, one batch of training about 31: it learns.
    assert 1.0 < metrics["eval/perplexity"] < 0.7 * vocabulary


def test_the_examples_padded_sentences_train_with_their_padding_left_out(tmp_path, fresh_imports):
    """my_project.text:char_sentences: a sentence per item, padded with targets of -100; the run
    evaluates only the characters it has."""
    import yaml

    from tests.conftest import REPO_ROOT
    from workers.loss import eval_sums

    example = REPO_ROOT / "examples" / "byo"
    package = pack_directory(example / "my_project")
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = yaml.safe_load((example / "text_spec.yaml").read_text())
    for split in ("train", "eval"):
        body["data"][split]["import"] = "my_project.text:char_sentences"
    trainer = Trainer(RunSpec.model_validate({**body, "code": {"digest": package.digest}, "max_duration": "6ba",
                                              "algorithms": []}))
    metrics = trainer.fit()
    vocabulary = len(set((example / "my_project" / "corpus.txt").read_text()))
    assert 1.0 < metrics["eval/perplexity"] < 0.7 * vocabulary
    trainer.eval_loader.set_epoch(0)
    counted = sum(int(eval_sums(trainer.state.model(tokens), targets)[2]) for tokens, targets in trainer.eval_loader)
    from my_project.text import char_sentences  # the package's own module, installed above

    sentences = char_sentences("eval", 64)
    assert counted == sum(int((targets != -100).sum()) for _, targets in sentences) < len(sentences) * 64


def test_the_builder_gets_classes_and_channels_for_images_and_vocab_size_for_text(tmp_path, fresh_imports):
    from api.model_specs import ImportedModelSpec
    from workers.models import build_model

    root = tmp_path / "src" / "my_project"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "nets.py").write_text("import torch.nn as nn\n\n\ndef build(**kwargs):\n"
                                  "    model = nn.Identity()\n    model.kwargs = kwargs\n    return model\n")
    package = pack_directory(root)
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    spec = ImportedModelSpec.model_validate({"import": "my_project.nets:build", "params": {"depth": 2}})
    assert build_model(spec, num_classes=10, in_channels=1, domain="vision").kwargs == {
        "num_classes": 10, "in_channels": 1, "depth": 2}
    assert build_model(spec, num_classes=84, in_channels=128, domain="text").kwargs == {"vocab_size": 84, "depth": 2}


def test_alibi_on_a_user_language_model_without_our_attention_is_noted_not_refused(tmp_path, fresh_imports):
    root = tmp_path / "src" / "my_lm"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "lm.py").write_text("import torch.nn as nn\n\n\ndef build(vocab_size, width=16):\n"
                                "    return nn.Sequential(nn.Embedding(vocab_size, width),\n"
                                "                         nn.Linear(width, vocab_size))\n")
    package = pack_directory(root)
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    spec = RunSpec.model_validate({
        "name": "byo-text", "model": {"import": "my_lm.lm:build"}, "code": {"digest": package.digest},
        "data": {"train": {"name": "shakespeare", "seq_len": 16, "limit": 32}, "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 0.01}, "max_duration": "1ba",
        "algorithms": [{"name": "alibi", "max_sequence_length": 32}]})
    trainer = Trainer(spec)
    [note] = trainer.surgery_notes
    assert note.startswith("ALiBi found no module with a registered policy in Sequential")
    assert trainer.fit()["train/loss"] > 0


def test_a_shipped_model_trains_on_a_shipped_data_set_and_evaluates_on_its_test_set(tmp_path, fresh_imports):
    package = pack_directory(write_user_package(tmp_path / "src"))
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = user_spec("byo-data", package.digest, user_data=True, batches=8)
    body["data"]["eval"] = {"import": "my_project.data:without_classes", "params": {"size": 16}}  # the train set's 4
    trainer = Trainer(RunSpec.model_validate({**body, "eval_interval": "4ba"}), sink=MemorySink())
    assert type(trainer.state.model).__name__ == "TinyMLP"
    loader = trainer.train_loader
    assert (loader.num_classes, loader.in_channels, loader.image_size, len(loader)) == (4, 1, 8, 4)
    assert trainer.eval_loader.num_classes == 4
    metrics = trainer.fit()
    assert metrics["time/batch"] == 8 and metrics["time/epoch"] == 2 and 0.0 <= metrics["eval/accuracy"] <= 1.0
    import my_project.nets

    assert my_project.nets.LOSS_CALLS[0] == (16, 4)


def test_a_data_import_that_fails_names_its_field(tmp_path, fresh_imports):
    package = pack_directory(write_user_package(tmp_path / "src"))
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    body = user_spec("byo-data", package.digest, user_data=True)
    body["data"]["eval"] = {"import": "my_project.data:test_set", "params": {"size": 8}, "num_classes": 3}
    with pytest.raises(UserCodeError, match=r"data.eval.import 'my_project.data:test_set' has num_classes 3 but the "
                                         r"training data has 4"):
        Trainer(RunSpec.model_validate(body))
    body["data"]["eval"] = {"import": "my_project.missing:test_set"}
    with pytest.raises(UserCodeError, match=r"data.eval.import 'my_project.missing:test_set': importing module "
                                            r"'my_project.missing' failed: ModuleNotFoundError"):
        Trainer(RunSpec.model_validate(body))


def test_tessera_train_with_a_code_folder_that_is_not_there_is_a_usage_error(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["train", str(tmp_path / "spec.yaml"), "--code", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "not a folder" in result.output


def test_tessera_train_with_code_trains_your_model_on_your_data(tmp_path, fresh_imports, monkeypatch):
    import json

    import yaml
    from typer.testing import CliRunner

    from cli.main import app

    monkeypatch.delenv("PYTHONPATH", raising=False)  # --code adds the folder for local Ray workers
    folder = write_user_package(tmp_path / "src")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(user_spec("cli-byo-data", None, user_data=True, batches=2)))
    result = CliRunner().invoke(app, ["train", str(spec_file), "--code", str(folder), "--no-checkpoints"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output[result.output.rindex("{\n"):])
    assert metrics["time/batch"] == 2 and "eval/accuracy" in metrics


def _holding(path, mode):
    """A process that holds a ``mode`` (``SH``/``EX``) lock on ``path`` until its stdin closes."""
    import subprocess

    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
                               f"fcntl.flock(f, fcntl.LOCK_{mode}); print('held', flush=True); sys.stdin.read()",
                               str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_the_cache_prunes_folders_unused_for_its_keep_time_unless_a_process_holds_or_places_them(tmp_path):
    import os
    import time

    cache = tmp_path / "cache"
    cache.mkdir()
    old = time.time() - 8 * 86400
    for name in ("unused", "recent", "used_lately", "imported_from", "being_placed", "a_file"):
        entry = cache / name
        entry.mkdir() if name != "a_file" else entry.write_text("x")
        if name != "recent":
            os.utime(entry, (old, old))
    (cache / ".used_lately.inuse").touch()  # a process used it an hour ago, and has ended
    os.utime(cache / ".used_lately.inuse", (time.time() - 3600,) * 2)
    holders = [_holding(cache / ".imported_from.inuse", "SH"), _holding(cache / ".being_placed.lock", "EX")]
    os.utime(cache / ".imported_from.inuse", (old, old))
    try:
        assert sorted(code_cache.prune(cache, keep_s=7 * 86400)) == ["a_file", "unused"]
    finally:
        for holder in holders:
            holder.stdin.close()
            holder.wait(30)
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == \
        ["being_placed", "imported_from", "recent", "used_lately"]
    assert sorted(code_cache.prune(cache, keep_s=7 * 86400)) == ["being_placed", "imported_from"]  # let go
    assert not [p for p in cache.iterdir() if p.name.startswith(".stale-")]
    # A removed folder's lock files go with it; a kept one's stay.
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == \
        [".recent.inuse", ".used_lately.inuse"]


def test_prunes_at_once_remove_a_folder_once_and_leave_no_lock_files_and_no_warning(tmp_path, monkeypatch, caplog):
    """Every worker of a machine installs its run's code, and prunes, at about the same time. A
    prune whose listing holds a folder another one has removed since, or that opened a folder's
    lock files just before another one took it and deleted them, passes it by quietly and leaves
    no lock file behind."""
    import fcntl
    import logging
    import os
    import time

    cache = tmp_path / "cache"
    cache.mkdir()
    old = time.time() - 8 * 86400
    for name in ("listed_then_gone", "taken_while_opening"):
        (cache / name).mkdir()
        os.utime(cache / name, (old, old))
    listed = cache / "listed_then_gone"
    assert code_cache._prune_one(listed, now=time.time(), keep_s=86400)  # another prune, first
    with pytest.raises(FileNotFoundError):  # a stale listing's folder: prune() logs it at debug level
        code_cache._prune_one(listed, now=time.time(), keep_s=86400)

    real_flock, other = fcntl.flock, []

    def another_prune_first(file, operation):  # between this prune's opening a lock file and locking it
        if not other:
            monkeypatch.setattr(code_cache.fcntl, "flock", real_flock)
            other.append(code_cache._prune_one(cache / "taken_while_opening", now=time.time(), keep_s=86400))
        real_flock(file, operation)

    monkeypatch.setattr(code_cache.fcntl, "flock", another_prune_first)
    caplog.set_level(logging.DEBUG, logger=code_cache.__name__)
    assert code_cache.prune(cache, keep_s=86400) == [] and other == [True]
    assert not list(cache.iterdir())  # no folder, no lock file, nothing moved aside
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


def test_a_lock_granted_on_a_lock_file_a_prune_deleted_meanwhile_is_taken_again_on_the_new_file(tmp_path,
                                                                                             monkeypatch):
    """A process opens a folder's lock file; before its lock is granted, a prune that held it
    removes the folder and deletes the file. The lock it then gets is on a file nobody else will
    open: it locks the file now at the path instead, or a second process could lock that one
    and both would place (or a prune take what the other imports from)."""
    import fcntl
    import os

    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / "package"
    locked = []
    real_flock = fcntl.flock

    def pruned_meanwhile(file, operation):
        if not locked:
            os.unlink(file.name)  # what a prune holding the lock does before it lets go
        real_flock(file, operation)
        locked.append((file.name, os.fstat(file.fileno()).st_nlink))

    monkeypatch.setattr(code_cache.fcntl, "flock", pruned_meanwhile)
    code_cache.place(target, lambda staging: (staging / "a.py").write_text("x = 1\n"))
    assert locked == [(str(cache / ".package.lock"), 0), (str(cache / ".package.lock"), 1)]
    assert (target / "a.py").read_text() == "x = 1\n"
    locked.clear()
    code_cache.hold(target)  # the same for the shared lock of a process importing from it
    assert locked == [(str(cache / ".package.inuse"), 0), (str(cache / ".package.inuse"), 1)]
    assert code_cache.prune(cache, keep_s=0) == []  # held: the file at the path is the one locked
    code_cache._HELD.pop(str(target)).close()  # this process lets go: the next prune takes it
    assert code_cache.prune(cache, keep_s=0) == ["package"] and not list(cache.iterdir())


def test_installing_code_prunes_the_cache_but_not_what_this_process_imports_from(tmp_path, fresh_imports,
                                                                                monkeypatch):
    import os
    import time

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / ("0" * 64)).mkdir()  # an old run's package, unused for 8 days
    os.utime(cache / ("0" * 64), (time.time() - 8 * 86400,) * 2)
    package = pack_directory(write_user_package(tmp_path / "src"))
    in_use = cache / f".{package.digest}.inuse"  # its last use, 8 days ago: installing it now is a use
    in_use.touch()
    os.utime(in_use, (time.time() - 8 * 86400,) * 2)
    monkeypatch.setenv(code_cache.KEEP_DAYS_ENV, "7")
    folder = install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [package.digest]
    assert time.time() - in_use.stat().st_mtime < 60
    assert code_cache.prune(cache, keep_s=0) == []  # this process holds it while it lives
    assert (folder / "my_project" / "nets.py").is_file()
    for bad in ("-1", "a week", "nan"):
        monkeypatch.setenv(code_cache.KEEP_DAYS_ENV, bad)
        with pytest.raises(ValueError, match=rf"TESSERA_CODE_CACHE_KEEP_DAYS='{bad}': allowed: a number of days >= 0"):
            code_cache.keep_seconds()
    install_code(CodeRef(digest=package.digest), storage_url=store(tmp_path, package))  # logged, not raised
