"""Specs of data a user brings: image_folder and webdataset validate in a RunSpec, and each bad
field is named with its value and what is allowed."""

import copy

import pytest

from api.specs import RunSpec
from tests.api.test_specs import EXAMPLE, errors_of

WDS = {"name": "webdataset", "urls": "s3://bucket/fmnist-train-{000000..000019}.tar", "image_key": "png",
       "label_key": "cls", "num_samples": 60000, "shuffle_buffer": 2000}
FOLDER = {"name": "image_folder", "root": "s3://bucket/images/train",
          "transforms": {"resize": 36, "crop": 32, "hflip": True,
                         "normalize": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}}


def with_data(train, eval_=None):
    body = copy.deepcopy(EXAMPLE)
    body["data"]["train"] = train
    body["data"]["eval"] = eval_
    return body


def test_the_issue_example_of_a_webdataset_spec_is_valid_with_defaults():
    spec = RunSpec.model_validate(with_data(WDS, {**WDS, "num_samples": 10000}))
    train = spec.data.train
    assert (train.num_classes, train.channels, train.num_workers) == (10, 3, 2)
    assert RunSpec.model_validate(spec.model_dump(mode="json")) == spec


def test_an_image_folder_spec_is_valid_local_or_s3():
    assert RunSpec.model_validate(with_data(FOLDER)).data.train.transforms.crop == 32
    assert RunSpec.model_validate(with_data({"name": "image_folder", "root": "/data/train"})).data.train.root


@pytest.mark.parametrize(("train", "field", "says"), [
    ({**WDS, "num_samples": 0}, "data.train.num_samples", "greater than or equal to 1"),
    ({**WDS, "urls": "s3://bucket/x-{000..009.tar"}, "data.train.urls", "unbalanced braces"),
    ({**WDS, "urls": "ftp://host/x.tar"}, "data.train.urls", "not a local path, file:// URL or s3://"),
    ({**WDS, "shuffle": 3}, "data.train.shuffle", "Extra inputs are not permitted"),
    ({**WDS, "channels": 2}, "data.train.channels", "Input should be 1 or 3"),
    ({**FOLDER, "transforms": {"normalize": {"mean": [0.5, 0.5], "std": [0.2]}}}, "data.train.transforms",
     "normalize.mean has 2 values but normalize.std has 1"),
    ({**FOLDER, "transforms": {"normalize": {"mean": [0.5, 0.5], "std": [0.2, 0.2]}}}, "data.train",
     "channels is 3; give 1 or 3"),
    ({**FOLDER, "num_workers": 64}, "data.train.num_workers", "less than or equal to 32"),
])
def test_bad_data_fields_are_named_with_value_and_what_is_allowed(train, field, says):
    problems = errors_of(with_data(train))
    assert any(path.startswith(field) and says in msg for path, msg, _ in problems), problems


def test_train_and_eval_must_be_the_same_kind_of_data():
    problems = errors_of(with_data(WDS, FOLDER))
    assert any("data.eval.name 'image_folder' differs from data.train.name 'webdataset'" in msg
               for _, msg, _ in problems), problems


def test_the_bring_your_own_data_example_is_a_valid_spec():
    from pathlib import Path

    import yaml

    body = yaml.safe_load((Path(__file__).parents[2] / "examples" / "fashion_mnist_webdataset.yaml").read_text())
    spec = RunSpec.model_validate(body)
    assert spec.data.train.name == spec.data.eval.name == "webdataset" and spec.data.train.channels == 1


OWN_TRAIN = {"import": "my_project.data:train_set", "params": {"root": "/data/x", "size": 64}}
OWN_EVAL = {"import": "my_project.data:test_set", "num_classes": 10, "num_workers": 2}


def test_your_own_data_set_is_routed_on_import_named_import_and_round_trips():
    from api.data_specs import ImportedDataSpec, dataset_domain

    spec = RunSpec.model_validate(with_data(OWN_TRAIN, OWN_EVAL))
    train, evaluated = spec.data.train, spec.data.eval
    assert isinstance(train, ImportedDataSpec) and train.name == evaluated.name == "import"
    assert (train.module_name, train.attribute, train.params["size"]) == ("my_project.data", "train_set", 64)
    assert (train.num_classes, train.num_workers, evaluated.num_classes, evaluated.num_workers) == (None, 0, 10, 2)
    assert dataset_domain(train) == "vision"
    dumped = spec.model_dump(mode="json")["data"]
    assert dumped["train"]["import"] == "my_project.data:train_set" and "name" not in dumped["train"]
    assert RunSpec.model_validate(spec.model_dump(mode="json")) == spec


@pytest.mark.parametrize(("train", "field", "says"), [
    ({"import": "my-project/data.py"}, "data.train.import",
     "import 'my-project/data.py' must be 'package.module:callable' (dotted Python names, one colon), e.g. "
     "'my_project.data:train_set'"),
    ({**OWN_TRAIN, "root": "/data"}, "data.train",
     "unknown field(s) 'root' next to 'import'; allowed fields here: import, params, task, seq_len, num_classes, "
     "num_workers"),
    ({**OWN_TRAIN, "num_classes": 0}, "data.train.num_classes", "greater than or equal to 1"),
    ({**OWN_TRAIN, "num_workers": 64}, "data.train.num_workers", "less than or equal to 32"),
])
def test_bad_fields_of_your_own_data_set_are_named_with_value_and_what_is_allowed(train, field, says):
    problems = errors_of(with_data(train))
    assert any(path == field and says in msg for path, msg, _ in problems), problems


@pytest.mark.parametrize(("train", "eval_", "says"), [
    (OWN_TRAIN, {"name": "digits", "split": "test"},
     "data.eval is the named data set 'digits' but data.train is your own (import)"),
    ({"name": "digits"}, OWN_EVAL, "data.eval is your own data set (import) but data.train is the named data set "
                                   "'digits'"),
])
def test_your_own_data_set_and_a_named_one_do_not_mix_in_train_and_eval(train, eval_, says):
    problems = errors_of(with_data(train, eval_))
    assert any(says in msg and "import both" in msg for _, msg, _ in problems), problems


def test_your_own_data_is_vision_data_of_unknown_size_to_the_cross_field_rules():
    from api.specs import unrunnable_problems

    body = with_data(OWN_TRAIN, OWN_EVAL)
    body["data"]["batch_size"] = 4096  # its size is known only on the worker: not checked here
    assert unrunnable_problems(RunSpec.model_validate(body)) == []
    body["max_duration"] = "1000tok"
    assert [p[0] for p in unrunnable_problems(RunSpec.model_validate(body))] == ["max_duration"]
    text_model = {**with_data(OWN_TRAIN), "model": {"name": "gpt_small"}, "algorithms": []}
    assert any("model 'gpt_small' is a text model but data set import 'my_project.data:train_set' is vision data (your own data set is "
               "classification data" in msg for _, msg, _ in errors_of(text_model))


def test_a_sweep_over_your_own_data_cannot_decide_on_perplexity():
    from api.sweeps import SweepSpec, metric_problems

    sweep = SweepSpec.model_validate({"name": "own", "base": with_data(OWN_TRAIN, OWN_EVAL),
                                      "metric": "eval/perplexity", "mode": "min",
                                      "search": {"params": {"optimizer.lr": {"grid": [0.1, 0.2]}}}})
    [(field, _, why)] = metric_problems(sweep)
    assert field == "metric" and "data set import 'my_project.data:train_set' is vision" in why


@pytest.mark.parametrize("field, value", [
    ("data.train", {"name": "digits", "import": "my_project.data:train_set"}),
    ("model", {"name": "simple_cnn", "import": "my_project.nets:build"}),
])
def test_a_name_and_an_import_together_are_refused_naming_both(field, value):
    body = copy.deepcopy(EXAMPLE)
    *parents, last = field.split(".")
    node = body
    for key in parents:
        node = node[key]
    node[last] = value
    [(where, message, _)] = errors_of(body)
    assert where == field and "has both name" in message and "not both" in message


TOKENS = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": 16}
GPT = {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 32}}


def test_your_own_token_data_is_text_for_a_language_model_and_counts_tokens():
    from api.data_specs import dataset_domain

    body = {**with_data(TOKENS, {**TOKENS, "import": "my_project.data:tokens_test", "seq_len": 32}),
            "model": GPT, "max_duration": "4096tok", "algorithms": [{"name": "seq_length_warmup"}],
            "optimizer": {"name": "adamw", "lr": 0.003}}
    spec = RunSpec.model_validate(body)
    assert dataset_domain(spec.data.train) == "text" and spec.data.train.seq_len == 16
    assert RunSpec.model_validate(spec.model_dump(mode="json")) == spec
    # A classification data set dumps as it did before tasks: stored specs compare equal.
    assert set(RunSpec.model_validate(with_data(OWN_TRAIN)).model_dump(mode="json")["data"]["train"]) == {
        "import", "params", "num_classes", "num_workers"}


@pytest.mark.parametrize(("change", "field", "says"), [
    (lambda b: b["data"]["train"].pop("seq_len"), "data.train.seq_len",
     "data.train.seq_len is missing: task 'language_model' needs"),
    (lambda b: b["data"]["train"].update(task="classification"), "data.train.seq_len",
     "data.train.seq_len 16 is for task 'language_model'"),
    (lambda b: b["data"]["train"].update(task="text"), "data.train.task", "'classification' or 'language_model'"),
    (lambda b: b["data"]["train"].update(seq_len=64), "", "data.train.seq_len 64 exceeds model.params.max_seq_len 32"),
    (lambda b: b.update(algorithms=[{"name": "cutmix"}]), "",
     "'cutmix' is for vision data but data set import 'my_project.data:tokens' is text"),
    (lambda b: b["data"].update(eval={"import": "my_project.data:test_set"}), "data.eval.task",
     "data.eval.task 'classification' differs from data.train.task 'language_model'"),
    (lambda b: b.update(model={"name": "simple_cnn"}), "",
     "your own data set of task language_model is text data"),
])
def test_bad_token_data_fields_are_named_with_what_is_allowed(change, field, says):
    """As a 422 names them (``format_validation_errors``: a rule that spans fields names its field first)."""
    from pydantic import ValidationError

    from api.validation_errors import format_validation_errors

    body = {**with_data(dict(TOKENS)), "model": copy.deepcopy(GPT), "optimizer": {"name": "adamw", "lr": 0.003}}
    change(body)
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(body)
    problems = [(item["field"], item["msg"]) for item in format_validation_errors(info.value.errors(), body, None)]
    assert any(path.startswith(field) and says in msg for path, msg in problems), problems
