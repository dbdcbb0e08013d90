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
