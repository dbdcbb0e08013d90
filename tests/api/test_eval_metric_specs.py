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


def test_the_same_callable_with_other_params_is_another_metric_but_the_same_twice_is_refused():
    other = {**OWN, "params": {"beta": 2}}
    assert len(RunSpec.model_validate(spec([OWN, other])).eval_metrics) == 2
    assert "eval_metrics[1] 'import my_project.metrics:fbeta' is listed twice" in problems(spec([OWN, dict(OWN)]))


@pytest.mark.parametrize("metric, words", [
    ("F1_macro", "close names: f1_macro"),
    ({"import": "metrics.py"}, "must be 'package.module:callable'"),
    ({"import": "m:f", "args": {}}, "unknown field(s) 'args' next to 'import'; allowed fields here: import, params"),
    (["auroc"], "a metric is a built-in's name"),
])
def test_a_metric_of_no_known_form_is_refused_saying_what_is_allowed(metric, words):
    assert words in problems(spec([metric]))
