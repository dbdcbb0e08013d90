"""Your own data set (``data.train: {import: ...}``): built from the user's package, batched with
the image_folder loader's order, striding and exact resume, every item checked."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from api.data_specs import ImportedDataSpec
from tests.workers.byo_helpers import importable_user_package
from workers.data.user_data import UserDataLoader
from workers.models.code_cache import UserCodeError


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``my_project`` (``tests.workers.byo_helpers``) importable from a folder, forgotten after the test."""
    with importable_user_package(tmp_path / "src", monkeypatch):
        yield


def spec(target: str = "train_set", **fields) -> ImportedDataSpec:
    return ImportedDataSpec.model_validate({"import": f"my_project.data:{target}", **fields})


def loader(data_spec: ImportedDataSpec, **kwargs) -> UserDataLoader:
    return UserDataLoader(data_spec, field="data.train", **{"batch_size": 16, "seed": 3, **kwargs})


def items(batches) -> list[int]:
    """The indices of the items handed out (``Blobs`` writes each item's index at pixel (0, 0, 0))."""
    return [int(i) for images, _ in batches for i in images.reshape(len(images), -1)[:, 0].round().long()]


def test_batches_hold_the_items_with_their_labels_and_the_shape_sets_channels_and_size(user_package):
    data = loader(spec(params={"size": 40, "channels": 3}), train=False)
    assert (data.num_classes, data.in_channels, data.image_size, len(data)) == (4, 3, 8, 3)  # 16, 16, 8
    batches = list(data)
    assert [tuple(b[0].shape) for b in batches] == [(16, 3, 8, 8), (16, 3, 8, 8), (8, 3, 8, 8)]
    assert items(batches) == list(range(40))  # evaluation: in order, the last partial batch kept
    labels = torch.cat([b[1] for b in batches])
    assert labels.dtype == torch.int64 and labels.tolist() == [i % 4 for i in range(40)]


def test_a_feature_vector_sets_in_channels_to_its_length_and_no_image_size(user_package):
    data = loader(spec(params={"features": True}, num_classes=6))
    assert (data.num_classes, data.in_channels, data.image_size) == (6, 64, None)
    assert tuple(next(iter(data))[0].shape) == (16, 64)


def test_two_ranks_each_take_every_other_item_once_an_epoch_and_epochs_differ(user_package):
    ranks = [loader(spec(), rank=r, world_size=2) for r in range(2)]
    first = [items(r) for r in ranks]
    assert [len(x) for x in first] == [32, 32] and sorted(first[0] + first[1]) == list(range(64))
    assert first[0] != list(range(0, 64, 2))  # shuffled
    for r in ranks:
        r.set_epoch(1)
    assert [items(r) for r in ranks] != first


def test_a_resume_from_a_saved_position_gives_the_remaining_batches_bitwise(user_package):
    full = list(loader(spec()))
    trained = loader(spec())
    list(itertools.islice(trained, 2))  # as the trainer stops: no batch taken beyond
    state = trained.state_dict()
    assert state == {"epoch": 0, "batch_in_epoch": 2}
    resumed = loader(spec())
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 2 and resumed.exhausted
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[2:], rest))


def test_loader_worker_processes_serve_the_same_batches_and_name_a_bad_item(user_package):
    in_process = items(loader(spec()))
    assert items(loader(spec(num_workers=2))) == in_process
    with pytest.raises(Exception, match=r"data.train.import 'my_project.data:train_set': item 37: label 7 is "
                                         r"outside \[0, 4\)"):
        list(loader(spec(params={"bad_label_at": 37}, num_workers=2), train=False))


@pytest.mark.parametrize(("target", "fields", "message"), [
    ("train_set", {"params": {"bad_label_at": 5}},
     r"data.train.import 'my_project.data:train_set': item 5: label 7 is outside \[0, 4\) \(num_classes 4\); "
     r"allowed: an integer in \[0, 4\)"),
    ("train_set", {"params": {"bad_shape_at": 9}},
     r"item 9: inputs have shape \(1, 4, 8\) but item 0 has \(1, 8, 8\); every item must have one shape"),
    ("broken", {"params": {"size": 3}},
     r"(?s)data.train.import 'my_project.data:broken': calling it with size=3 failed: RuntimeError: the data is "
     r"not there\nTraceback \(last frames\):.*my_project/data.py"),
    ("not_a_dataset", {}, r"'my_project.data:not_a_dataset' returned a int, not a map-style "
                          r"torch.utils.data.Dataset \(an object with __len__ and __getitem__\)"),
    ("stream", {}, r"returned an IterableDataset \(Stream\); allowed: a map-style torch.utils.data.Dataset"),
    ("missing", {}, r"data.train.import 'my_project.data:missing': 'missing' does not exist in .*data.py"),
    ("without_classes", {}, r"the number of classes is unknown; set data.train.num_classes in the spec, or give "
                            r"the data set a num_classes attribute"),
])
def test_a_bad_data_set_fails_naming_the_field_the_item_and_what_is_allowed(user_package, target, fields, message):
    with pytest.raises(UserCodeError, match=message):
        list(loader(spec(target, **fields), train=False))


def test_the_spec_num_classes_overrides_the_attribute_and_bounds_the_labels(user_package):
    assert loader(spec("without_classes", num_classes=4)).num_classes == 4
    with pytest.raises(UserCodeError, match=r"item 2: label 2 is outside \[0, 2\)"):
        list(loader(spec(num_classes=2), train=False))


def test_too_few_items_for_a_full_batch_is_refused(user_package):
    with pytest.raises(UserCodeError, match=r"the data set has 10 items: no full batch of 16 for rank 0 of 1"):
        loader(spec(params={"size": 10}))


def test_a_data_set_that_draws_random_numbers_reads_the_same_items_anywhere_and_leaves_the_ranks_state(
        user_package):
    def noise(batches) -> list[float]:
        return [x for images, _ in batches for x in images[:, 0, 1, 1].tolist()]

    noisy = spec(params={"noisy": True})
    torch.manual_seed(5), random.seed(5), np.random.seed(5)
    states = torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    in_process = noise(loader(noisy))
    assert torch.equal(torch.random.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()  # the training process's generators, untouched
    assert len(set(in_process)) == len(in_process)  # the items do draw numbers
    assert noise(loader(spec(params={"noisy": True}, num_workers=2))) == in_process  # other processes
    resumed = loader(noisy)
    resumed.load_state_dict({"epoch": 0, "batch_in_epoch": 2})
    assert noise(resumed) == in_process[2 * 16:]  # a resumed run reads what the uninterrupted one did
    next_epoch = loader(noisy)
    next_epoch.set_epoch(1)
    assert sorted(noise(next_epoch)) != sorted(in_process)  # and each epoch draws anew


def test_a_data_set_that_opens_its_file_on_first_use_goes_to_loader_processes_unopened(user_package, tmp_path):
    (tmp_path / "data.bin").write_bytes(b"x")
    lazy = loader(spec("lazy_file", params={"path": str(tmp_path / "data.bin")}, num_workers=2))
    assert items(lazy) == items(loader(spec()))  # the same order as any data set of its size


def test_an_evaluation_set_of_another_shape_than_trainings_is_refused(user_package):
    with pytest.raises(UserCodeError, match=r"data.eval.import 'my_project.data:test_set': its items have shape "
                                            r"\(3, 8, 8\), but data.train's have \(1, 8, 8\)"):
        UserDataLoader(spec("test_set", params={"channels": 3}), field="data.eval", batch_size=16, train=False,
                       shape=(1, 8, 8))


def test_a_training_set_whose_items_disagree_is_named_before_the_evaluation_set_is_blamed(user_package):
    """The evaluation set's shape is compared with the training set's item 0; a training set whose
    own items disagree (item 5 of another shape) is the error, not the evaluation set it was compared with."""
    from api.specs import RunSpec
    from tests.workers.byo_helpers import user_spec
    from workers.trainer import Trainer

    body = user_spec("bad-train", None, user_data=True)
    body["data"]["train"]["params"] = {"bad_shape_at": 5}
    body["data"]["eval"]["params"] = {"channels": 3}
    with pytest.raises(UserCodeError, match=r"^data.train.import 'my_project.data:train_set': item 5: inputs have "
                                            r"shape \(1, 4, 8\) but item 0 has \(1, 8, 8\)"):
        Trainer(RunSpec.model_validate(body))


def test_an_evaluation_set_of_another_shape_is_refused_once_the_training_sets_first_items_agree(user_package):
    train = loader(spec())
    assert train.check_items() == 64 and train.check_items(8) == 8  # every item of 64, or the first 8
    with pytest.raises(UserCodeError, match=r"data.eval.import 'my_project.data:test_set': its items have shape "
                                            r"\(3, 8, 8\), but data.train's have \(1, 8, 8\) \(its first 64 items "
                                            r"all do\); evaluation data must have the training data's shape"):
        UserDataLoader(spec("test_set", params={"channels": 3}), field="data.eval", batch_size=16, train=False,
                       shape=train.item_shape, check_train=train.check_items)


def test_feature_vectors_with_a_named_model_fail_naming_both(user_package):
    from api.specs import RunSpec
    from tests.workers.byo_helpers import user_spec
    from workers.trainer import Trainer

    body = user_spec("features", None, user_data=True)
    body["data"]["train"]["params"] = {"features": True}
    body["data"]["eval"] = None
    body["model"] = {"name": "simple_cnn"}
    with pytest.raises(UserCodeError, match=r"data.train.import 'my_project.data:train_set' gives feature vectors "
                                            r"of shape \(64,\), but model 'simple_cnn' takes images \(C, H, W\)"):
        Trainer(RunSpec.model_validate(body))


def test_feature_vectors_with_methods_that_work_on_pixels_fail_naming_them_and_others_train(user_package, tmp_path):
    """CutMix, RandAugment and the other ``needs_images`` methods cut, resize or recolour images,
    and SelectiveBackprop with a scale_factor below 1 scores on downscaled ones: refused at the
    start, naming each (they failed inside their transforms); MixUp mixes any inputs and trains."""
    from api.specs import RunSpec
    from tests.workers.byo_helpers import user_spec
    from workers.trainer import Trainer

    (tmp_path / "src" / "my_project" / "flat.py").write_text(
        "import torch.nn as nn\n\n\ndef build(num_classes, in_channels):\n"
        "    return nn.Sequential(nn.Linear(in_channels, 8), nn.ReLU(), nn.Linear(8, num_classes))\n")

    def features_run(*algorithms):
        body = user_spec("features", None, user_data=True, batches=2,
                         algorithms=[{"name": a} if isinstance(a, str) else a for a in algorithms])
        body["data"]["train"]["params"] = {"features": True}
        body["data"]["eval"] = None
        body["model"] = {"import": "my_project.flat:build"}
        return RunSpec.model_validate(body)

    with pytest.raises(UserCodeError, match=r"data\.train\.import 'my_project\.data:train_set' gives feature vectors "
                                            r"of shape \(64,\), but algorithms\[0\] 'cutmix', algorithms\[2\] "
                                            r"'randaugment' work on the pixels"):
        Trainer(features_run("cutmix", "mixup", "randaugment"))
    with pytest.raises(UserCodeError, match=r"algorithms\[1\]\.scale_factor 0\.5 of 'selective_backprop'"):
        Trainer(features_run("mixup", {"name": "selective_backprop", "scale_factor": 0.5}))
    metrics = Trainer(features_run("mixup")).fit()
    assert metrics["train/loss"] > 0


def test_token_data_batches_ids_and_next_token_targets_and_names_a_bad_item(user_package):
    """task language_model: items of seq_len token ids, batched as (B, seq_len) int64 inputs and
    targets; the vocabulary is num_classes; a float tensor, a short item or an id outside the
    vocabulary is named with its index and what is allowed."""
    data = loader(spec("tokens", task="language_model", seq_len=16))
    assert (data.num_classes, data.in_channels, data.image_size, len(data)) == (12, 16, None, 4)
    tokens, targets = next(iter(data))
    assert tokens.shape == targets.shape == (16, 16) and tokens.dtype == targets.dtype == torch.int64
    assert torch.equal(tokens[:, 1:], targets[:, :-1])  # the next token of each position
    for bad, says in [("float", r"tokens are torch\.float32; allowed: integer token ids"),
                      ("short", r"targets have shape \(15,\); allowed: \(16,\)"),
                      ("id", r"tokens hold token id 12, outside \[0, 12\) \(the vocabulary, num_classes 12\)")]:
        with pytest.raises(UserCodeError, match=rf"data\.train\.import 'my_project\.data:tokens': item 0: {says}"):
            loader(spec("tokens", task="language_model", seq_len=16, params={"bad": bad, "bad_at": 0}))
    with pytest.raises(UserCodeError, match=r"item 0: tokens have shape \(8,\); allowed: \(16,\) \(data\.train\.seq_len "
                                            r"tokens"):
        loader(spec("tokens", task="language_model", seq_len=16, params={"seq_len": 8}))
    in_rank = list(loader(spec("tokens", task="language_model", seq_len=16)))
    in_processes = list(loader(spec("tokens", task="language_model", seq_len=16, num_workers=2)))
    assert len(in_rank) == len(in_processes) == 4
    assert all(torch.equal(a, b) for batch, again in zip(in_rank, in_processes) for a, b in zip(batch, again))


def test_a_language_model_trains_on_your_own_token_data_counting_tokens_and_reporting_perplexity(user_package):
    from api.specs import RunSpec
    from workers.trainer import Trainer

    tokens = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": 16}
    spec = RunSpec.model_validate({
        "name": "own-text", "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                                       "max_seq_len": 32}},
        "data": {"train": tokens, "eval": {**tokens, "params": {"size": 8, "seq_len": 32}, "seq_len": 32},
                 "batch_size": 8},
        "optimizer": {"name": "adamw", "lr": 0.01}, "max_duration": "512tok", "seed": 0})
    trainer = Trainer(spec)
    assert trainer.state.max_batches == 4  # 512 tokens at 8 x 16 a batch
    metrics = trainer.fit()
    assert trainer.state.timestamp.token == 512
    # A uniform guess over the 12 ids scores 12, and one batch of training about 10.5: it learned.
    assert 1.0 < metrics["eval/perplexity"] < 9.0


def test_token_data_may_ignore_targets_with_minus_100_and_the_run_counts_only_the_kept_ones(user_package):
    """Padding: a target of -100 counts for nothing (PyTorch's and Hugging Face's convention). It
    reaches the batch as it is; an item with no target kept, a negative target other than -100 or a
    token of -100 is refused, naming the item; a run on padded data trains with label smoothing and
    selective backprop (both read targets) to a finite loss, and its evaluation counts only kept tokens."""
    from api.specs import RunSpec
    from workers.loss import eval_sums
    from workers.trainer import Trainer

    _, targets = next(iter(loader(spec("tokens", task="language_model", seq_len=16, params={"pad": 5}))))
    ignored = targets == -100  # an odd item's last 5 targets, as the data set made them
    assert ignored.any() and all(row.sum() in (0, 5) and row[-5:].all() == bool(row.sum()) for row in ignored)
    for bad, says in [("ignored", r"every target is -100 \(ignored\), so the item trains nothing"),
                      ("negative", r"targets hold token id -5, outside \[0, 12\) .*allowed: ids in \[0, 12\), and -100 "
                                   r"to ignore a position"),
                      ("ignored_token", r"tokens hold token id -100, outside \[0, 12\) .*allowed: ids in \[0, 12\)$"),
                      ("uint8", r"targets hold token id 156, outside \[0, 12\)")]:
        with pytest.raises(UserCodeError, match=rf"item 0: {says}"):
            loader(spec("tokens", task="language_model", seq_len=16, params={"bad": bad, "bad_at": 0, "pad": 5}))

    tokens = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": 16, "params": {"pad": 6}}
    spec_ = RunSpec.model_validate({
        "name": "padded-text", "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                                          "max_seq_len": 16}},
        "data": {"train": tokens, "eval": {**tokens, "params": {"size": 8, "pad": 6}}, "batch_size": 8},
        "algorithms": [{"name": "label_smoothing", "smoothing": 0.1},
                       {"name": "selective_backprop", "start": 0.0, "end": 1.0, "keep": 0.5, "interval": 1}],
        "optimizer": {"name": "adamw", "lr": 0.01}, "max_duration": "8ba", "seed": 0})
    trainer = Trainer(spec_)
    metrics = trainer.fit()
    assert torch.isfinite(torch.tensor(metrics["train/loss"])) and metrics["train/loss"] > 0
    assert 1.0 < metrics["eval/perplexity"] < 12.0  # a uniform guess over the 12 ids scores 12
    trainer.eval_loader.set_epoch(0)
    (inputs, targets), = trainer.eval_loader
    assert eval_sums(trainer.state.model(inputs), targets)[2] == 8 * 16 - 4 * 6  # 4 padded items of 8


def test_a_fork_of_a_language_model_trains_on_at_another_seq_len(user_package, tmp_path):
    """Text's in_channels is its seq_len, which no tensor depends on: a fork that trains the parent's
    weights on longer windows loads them (the fingerprint's other fields still must match)."""
    from api.lineage import ForkInfo
    from api.specs import RunSpec
    from tests.workers.checkpoint_helpers import latest_url
    from workers.reporter import MemorySink
    from workers.trainer import Trainer, train

    def lm(seq_len):
        tokens = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": seq_len,
                  "params": {"seq_len": seq_len}}
        return RunSpec.model_validate({
            "name": "lm", "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16,
                                                                     "max_seq_len": 32}},
            "data": {"train": tokens, "batch_size": 8}, "optimizer": {"name": "adamw", "lr": 0.01},
            "max_duration": "2ba", "checkpoint": {"interval": "2ba"}})

    train(lm(16), checkpoint_url=f"file://{tmp_path}/parent", sink=MemorySink())
    source = latest_url(f"file://{tmp_path}/parent")
    fork = ForkInfo(from_="latest", checkpoint_url=source, step=2, load_optimizer=True)
    child = Trainer(lm(32), sink=MemorySink(), checkpoint_url=f"file://{tmp_path}/child", fork=fork)
    assert child.resume() == source and child.in_channels == 32
