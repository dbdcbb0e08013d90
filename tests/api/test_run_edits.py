"""Tag edits, tag rules, ``order_by`` parsing and the spec diff: the pure functions behind
``tessera tag``, ``PATCH /runs/{id}``, ``GET /runs?order_by=`` and ``tessera diff``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from api.run_edits import RunUpdate, apply_tag_edits, order_by_key, tag_problem
from api.spec_diff import flatten, spec_diff


def test_tag_edits_add_and_remove_in_order_keeping_first_added_order():
    assert apply_tag_edits(["a", "b"], ["+c", "-a", "+b", "+a"]) == ["b", "c", "a"]
    with pytest.raises(ValueError, match=r"tag edit '\+bad tag!': tag 'bad tag!' is not allowed"):
        apply_tag_edits(["a", "b"], ["+bad tag!"])  # named as typed, not as tags[2] of the merged list
    with pytest.raises(ValueError, match=r"\+NAME"):
        apply_tag_edits([], ["c"])


@pytest.mark.parametrize("tag, ok", [("baseline", True), ("lr:0.1", True), ("a/b=c-d_e.f", True), ("-x", False),
                                     ("has space", False), ("", False), ("x" * 64, True), ("x" * 65, False)])
def test_tag_rules(tag, ok):
    assert (tag_problem(tag) is None) == ok
    if not ok:
        with pytest.raises(ValidationError):
            RunUpdate(tags=[tag])


def test_order_by_names_a_metric_after_best():
    assert order_by_key("best:eval/accuracy") == "eval/accuracy"
    for bad in ("eval/accuracy", "best:", "worst:x"):
        with pytest.raises(ValueError, match="best:<metric key>"):
            order_by_key(bad)


def test_spec_diff_lists_only_differing_dotted_paths_with_each_value():
    a = {"optimizer": {"name": "sgd", "lr": 0.1}, "algorithms": [{"name": "cutmix"}], "seed": 1}
    b = {"optimizer": {"name": "sgd", "lr": 0.2}, "algorithms": [{"name": "cutmix"}, {"name": "ema"}], "seed": 1}
    assert spec_diff(a, b) == {"algorithms.1.name": [None, "ema"], "optimizer.lr": [0.1, 0.2]}
    assert spec_diff(a, a) == {}
    assert spec_diff({"x": True}, {"x": 1}) == {"x": [True, 1]}  # JSON's true is not 1
    assert flatten({"a": {}, "b": []}) == {"a": {}, "b": []}
    # A run without a code package against one with: the digest differs, and no "code: null, null" row.
    digest = "24ee" * 16
    assert spec_diff({"code": None, "seed": 1}, {"code": {"digest": digest}, "seed": 1}) == {
        "code.digest": [None, digest]}
    assert spec_diff({"data": {"limit": None, "x": 1}}, {"data": {"x": 1}}) == {}  # null or absent: the same
