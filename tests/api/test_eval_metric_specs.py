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
