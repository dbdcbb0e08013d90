"""``eval_metrics`` in a RunSpec (``api.eval_metric_specs``): what text data may list, and what
counts as listed twice."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.specs import RunSpec

OWN = {"import": "my_project.metrics:fbeta", "params": {"beta": 1}}


def spec(eval_metrics, *, text: bool = False) -> dict:
    data = ({"train": {"name": "shakespeare", "seq_len": 32}, "eval": {"name": "shakespeare", "split": "test",
                                                                        "seq_len": 32}} if text else
            {"train": {"name": "digits"}, "eval": {"name": "digits", "split": "test"}})
    return {"name": "m", "model": {"name": "gpt_small" if text else "simple_cnn"}, "data": {**data, "batch_size": 8},
            "optimizer": {"name": "sgd", "lr": 0.1}, "max_duration": "1ep", "eval_metrics": eval_metrics}


def problems(body) -> str:
    with pytest.raises(ValidationError) as raised:
        RunSpec.model_validate(body)
    return str(raised.value)


def test_text_data_may_list_top5_but_no_metric_of_class_labels_nor_its_own():
    assert RunSpec.model_validate(spec(["top5_accuracy"], text=True)).eval_metrics == ["top5_accuracy"]
    message = problems(spec(["top5_accuracy", "f1_macro", OWN], text=True))
    assert "eval_metrics[1] 'f1_macro' needs class labels" in message and "allowed are: top5_accuracy" in message
    assert "eval_metrics[2] 'import my_project.metrics:fbeta': your own metrics take classification data" in message


def test_the_same_callable_twice_needs_a_name_for_each_and_the_same_twice_is_refused():
    other = {**OWN, "params": {"beta": 2}}
    assert ("eval_metrics[1] 'import my_project.metrics:fbeta' would report a number it returns as eval/fbeta, as "
            "eval_metrics[0] would; give each a name of its own") in problems(spec([OWN, other]))
    named = RunSpec.model_validate(spec([OWN, {**other, "name": "f2"}])).eval_metrics
    assert [m.reported_name for m in named] == ["fbeta", "f2"]
    assert "eval_metrics[1] 'import my_project.metrics:fbeta' is listed twice" in problems(spec([OWN, dict(OWN)]))


def test_your_own_may_not_report_under_a_name_of_tesseras_own():
    message = problems(spec([{"import": "my_project.metrics:auroc"}]))
    assert "would report a number it returns as eval/auroc, which is Tessera's own; give it a name" in message
    assert RunSpec.model_validate(spec([{"import": "my_project.metrics:auroc", "name": "my_auroc"}]))
    assert "name 'accuracy': eval/accuracy is Tessera's own" in problems(spec([{**OWN, "name": "accuracy"}]))


def test_top5_of_five_classes_or_fewer_would_always_be_one():
    body = spec(["top5_accuracy"])
    for field, split in (("train", "train"), ("eval", "test")):
        body["data"][field] = {"name": "synthetic", "split": split, "num_classes": 5, "num_samples": 64}
    assert "would always be 1: the data has 5 classes" in problems(body)
    for split in ("train", "eval"):
        body["data"][split]["num_classes"] = 6
    assert RunSpec.model_validate(body).eval_metrics == ["top5_accuracy"]


@pytest.mark.parametrize("metric, words", [
    ("F1_macro", "close names: f1_macro"),
    ("accuracy", "eval/accuracy is reported at every evaluation already"),
    ({"import": "m:f", "name": "Bad name"}, "name 'Bad name': a name must match"),
    ({"import": "m:_private"}, "would report a number it returns as eval/_private, and a name must match"),
    ({"import": "m:f", "params": {"outputs": 1}}, "eval_metrics[0].params sets outputs, which Tessera passes itself"),
    ({"import": "metrics.py"}, "must be 'package.module:callable'"),
    ({"import": "m:f", "args": {}}, "unknown field(s) 'args' next to 'import'; allowed fields here: import, params"),
    (["auroc"], "a metric is a built-in's name"),
])
def test_a_metric_of_no_known_form_is_refused_saying_what_is_allowed(metric, words):
    assert words in problems(spec([metric]))


# Four mistakes, each independent of the others: each is an item of one 422, at its own index.
SEVERAL_MISTAKES = ["accuracy", "auroc", "f1", "auroc", {"import": "my_project.metrics:_private"}]
SEVERAL_MISTAKES_ITEMS = [
    (0, "accuracy", "eval/accuracy is reported at every evaluation already"),
    (2, "f1", "'f1' is not a built-in evaluation metric; close names: f1_macro"),
    (3, "auroc", "eval_metrics[3] 'auroc' is listed twice; list each metric once"),
    (4, {"import": "my_project.metrics:_private"},
     "eval_metrics[4] 'import my_project.metrics:_private' would report a number it returns as eval/_private, and "
     "a name must match"),
]


@pytest.fixture
def client(tmp_path):
    """The service's app, as POST /api/v1/runs and /api/v1/sweeps answer a spec."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from tests.conftest import ADMIN_HEADERS
    from tests.service.conftest import FakeJobs

    settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000")
    with TestClient(create_app(settings, jobs=FakeJobs(), run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        yield client


def assert_one_item_per_mistake(items: list[dict], within: list[str]) -> None:
    field = ".".join([*within, "eval_metrics"])
    expected = [(f"{field}[{index}]", ["body", *within, "eval_metrics", index], value)
                for index, value, _ in SEVERAL_MISTAKES_ITEMS]
    assert [(i["field"], i["loc"], i["input"]) for i in items] == expected, items
    for item, (_, _, words) in zip(items, SEVERAL_MISTAKES_ITEMS):
        assert words in item["msg"] and "\n" not in item["msg"], item


def test_one_submit_names_every_mistake_of_the_list_each_at_its_own_index(client):
    assert client.post("/api/v1/runs", json=spec(["auroc"])).status_code == 201  # the spec around them is valid
    response = client.post("/api/v1/runs", json=spec(SEVERAL_MISTAKES))
    assert response.status_code == 422, response.text
    assert_one_item_per_mistake(response.json()["detail"], within=[])


def test_a_sweep_s_base_names_every_mistake_of_its_list_too(client):
    body = {"name": "s", "base": spec(SEVERAL_MISTAKES), "search": {"params": {"optimizer.lr": {"grid": [0.1, 0.2]}}}}
    response = client.post("/api/v1/sweeps", json=body)
    assert response.status_code == 422, response.text
    assert_one_item_per_mistake(response.json()["detail"], within=["base"])


@pytest.mark.parametrize("metrics, fields", [
    (["accuracy", "accuracy"], ["eval_metrics[0]", "eval_metrics[1]"]),  # refused each: no "listed twice" too
    ([{"import": "m:f", "args": {}}, {"import": "m:f"}], ["eval_metrics[0]"]),  # the refused one reports no name
    (["accuracy", "auroc", {"import": "m:f", "params": {"outputs": 1}}], ["eval_metrics[0]", "eval_metrics[2].params"]),
    (["accuracy", *["auroc"] * 16], ["eval_metrics"]),  # too many: the list is refused whole, before its metrics
    (["auroc", "auroc", "f1"], ["eval_metrics[1]", "eval_metrics[2]"]),  # in the list's order, whichever rule found it
])
def test_the_list_s_own_rules_are_checked_over_the_metrics_that_are_not_refused(metrics, fields):
    from api.validation_errors import format_validation_errors

    body = spec(metrics)
    with pytest.raises(ValidationError) as raised:
        RunSpec.model_validate(body)
    items = format_validation_errors(raised.value.errors(), body, RunSpec.model_json_schema())
    assert [i["field"] for i in items] == fields, items


def test_a_metric_listed_twice_is_judged_once_beside_the_rules_of_the_rest_of_the_spec():
    message = problems(spec(["f1_macro", "f1_macro"], text=True))
    assert "eval_metrics[0] 'f1_macro' needs class labels" in message
    assert "eval_metrics[1] 'f1_macro' is listed twice" in message
    assert "eval_metrics[1] 'f1_macro' needs class labels" not in message
