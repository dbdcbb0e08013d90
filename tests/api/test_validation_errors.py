"""What a user reads for a spec that does not validate (``api.validation_errors``): the field as
written, the bad value and what is allowed, the same through the service's 422 and the CLI."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from api.errors import format_detail
from api.specs import RunSpec
from api.validation_errors import format_validation_errors
from cli.specfile import SpecFileError, load_spec
from tests.api.test_specs import EXAMPLE, patched



def items_of(changes: dict) -> list[dict]:
    """The 422 items of the example spec with ``changes`` (``patched``'s ``a__b`` keys)."""
    body = patched(**changes)
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(body)
    return format_validation_errors(info.value.errors(), body, RunSpec.model_json_schema())


@pytest.mark.parametrize("changes, field, value, allowed", [
    ({"parallelism": {"strategy": "none", "num_workers": 2}}, "parallelism.num_workers", 2, "exactly one worker"),
    ({"data__eval": {"name": "fashion_mnist"}}, "data.eval.name", "fashion_mnist", "must come from the same data set"),
    ({"max_wall_time": "12hours"}, "max_wall_time", "12hours", "hours or days: '90s', '90m', '12h', '2d'"),
    ({"name": "-bad"}, "name", "-bad", "starting with a letter or digit"),
    ({"checkpoint": {"keep_last": 1}}, "checkpoint.keep_last", 1, "greater than or equal to 2"),
])
def test_an_error_names_the_field_the_value_and_what_is_allowed(changes, field, value, allowed):
    [item] = items_of(changes)
    assert (item["field"], item["input"]) == (field, value) and allowed in item["msg"], item


def test_the_published_schema_states_the_bound_the_validator_applies():
    checkpoint = RunSpec.model_json_schema()["$defs"]["CheckpointSpec"]["properties"]["keep_last"]
    assert checkpoint["minimum"] == 2


def test_the_cli_prints_the_services_lines_for_a_spec_file(tmp_path):
    body = copy.deepcopy(EXAMPLE) | {"max_wall_time": "12hours", "parallelism": {"strategy": "none", "num_workers": 2}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(SpecFileError) as info:
        load_spec(path)
    with pytest.raises(ValidationError) as raw:
        RunSpec.model_validate(body)
    service_lines = format_detail(format_validation_errors(raw.value.errors(), body, RunSpec.model_json_schema()))
    assert str(info.value).splitlines()[1:] == [f"  {line}" for line in service_lines.splitlines()]
    assert str(info.value).splitlines()[1:] == [
        "  parallelism.num_workers 2: strategy 'none' runs exactly one worker; use strategy 'ddp' or 'fsdp' for more "
        "(got 2)",
        "  max_wall_time: should be a whole number of seconds, minutes, hours or days: '90s', '90m', '12h', '2d' "
        "(pattern ^[1-9][0-9]{0,8}(s|m|h|d)$) (got '12hours')"]


def test_a_rule_inside_a_sweeps_base_names_the_field_under_base():
    from api.sweeps import SweepSpec

    base = copy.deepcopy(EXAMPLE) | {"parallelism": {"strategy": "none", "num_workers": 2}}
    body = {"name": "sweep", "base": base, "search": {"algorithms": {"sets": [[]]}}}
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(body)
    [item] = format_validation_errors(info.value.errors(), body, SweepSpec.model_json_schema())
    assert (item["field"], item["input"]) == ("base.parallelism.num_workers", 2)


def test_several_broken_rules_are_one_item_each_naming_its_algorithm():
    items = items_of({"algorithms": [{"name": "alibi"}, {"name": "ema"}, {"name": "swa"}]})
    assert [(item["field"], item["input"]["name"]) for item in items] == [
        ("algorithms[0]", "alibi"), ("algorithms[0]", "alibi"), ("algorithms[1]", "ema")]
    assert "is for text data" in items[0]["msg"] and "needs a transformer" in items[1]["msg"]
    assert "'swa' do not compose" in items[2]["msg"]


@pytest.mark.parametrize("parts, field", [
    (["optimizer", "lr"], "optimizer.lr"),
    (["algorithms", 0, "alpha"], "algorithms[0].alpha"),
    (["search", "params", "optimizer.lr", "grid", 0], "search.params['optimizer.lr'].grid[0]"),
    (["search", "params", "seed"], "search.params.seed"),
    (["model", "params", "drop rate"], "model.params['drop rate']"),
    (["x", "1"], "x['1']"),
    (["x", "it's"], "x[\"it's\"]"),
    (["x", "a\\b'\"c"], "x['a\\\\b\\'\"c']"),
    (["optimizer", "optimizér"], "optimizer['optimizér']"),  # ASCII names only, as the dashboard reads them
])
def test_a_key_that_is_not_a_plain_name_is_written_in_brackets_and_read_back(parts, field):
    from api.validation_errors import join_field, split_field

    assert join_field(parts) == field
    assert split_field(field) == parts


@pytest.mark.parametrize("text", ["a..b", ".a", "a b", "a[0]b", "a['b"])
def test_split_field_refuses_what_is_no_field_name(text):
    from api.validation_errors import split_field

    with pytest.raises(ValueError, match="not a field name"):
        split_field(text)


def test_a_body_error_s_loc_keeps_a_dotted_key_whole_and_a_name_it_cannot_read_whole():
    from api.validation_errors import body_error

    item = body_error("base.search.params['optimizer.lr'].grid", "bad", [1], within=("body", "patch"))
    assert item["loc"] == ["body", "patch", "base", "search", "params", "optimizer.lr", "grid"]
    assert body_error("algorithms[1].alpha", "bad", 2)["loc"] == ["body", "algorithms", 1, "alpha"]
    assert body_error("a..b", "bad", None)["loc"] == ["body", "a..b"]


def test_field_path_keeps_a_dotted_key_whole_with_or_without_the_body():
    from api.validation_errors import field_path

    loc = ("search", "params", "optimizer.lr", "grid")
    body = {"search": {"params": {"optimizer.lr": {"grid": "0.1"}}}}
    assert field_path(loc, body) == field_path(loc, None) == "search.params['optimizer.lr'].grid"
    assert field_path(("search", "params", 1, "[key]"), {"search": {"params": {1: {}}}}) == "search.params['1'][key]"


def test_a_rule_s_message_naming_a_dotted_key_moves_the_key_into_the_field():
    body = {"search": {"params": {"optimizer.lr": {"grid": [-0.1]}, "seed": {"grid": [-1]}}}}
    errors = [{"type": "value_error", "loc": (), "msg": "Value error, search.params['optimizer.lr']: value -0.1 is bad",
               "input": body},
              {"type": "value_error", "loc": ("search",), "msg": "Value error, params.seed: value -1 is bad",
               "input": body["search"]}]
    items = format_validation_errors(errors, body, None)
    assert [(i["field"], i["input"], i["msg"]) for i in items] == [
        ("search.params['optimizer.lr']", {"grid": [-0.1]}, "value -0.1 is bad"),
        ("search.params.seed", {"grid": [-1]}, "value -1 is bad")]
    assert [i["loc"] for i in items] == [["body", "search", "params", "optimizer.lr"],
                                         ["body", "search", "params", "seed"]]


@pytest.mark.parametrize("changes, field", [
    ({"model__params": {"drop.rate": 0.1}}, "model.params['drop.rate']"),  # a named model's params
    ({"model__bad key": 1}, "model['bad key']"),
    ({"model__params": {"depth": 1}}, "model.params.depth"),  # a plain key stays dotted
])
def test_an_unknown_key_with_a_dot_or_a_space_is_named_whole(changes, field):
    [item] = items_of(changes)
    assert item["field"] == field and "Extra inputs are not permitted" in item["msg"], item


def test_an_unknown_name_in_a_spec_file_reads_as_in_the_service():
    [item] = items_of({"algorithms": [{"name": "cutmx"}]})
    assert item["field"] == "algorithms[0].name" and item["input"] == "cutmx"
    assert item["msg"].startswith("unknown algorithm 'cutmx'; did you mean 'cutmix'? known: alibi, ")
    [item] = items_of({"data__train": {"name": "mnist"}, "data__eval": None})
    assert item["field"] == "data.train.name" and item["msg"].startswith("unknown data set 'mnist'; known: digits")


def test_a_sweep_file_s_domain_and_a_fork_step_are_named_by_their_forms():
    """Validated from Python (a spec file, the SDK), pydantic says "instance of ParamDomain"."""
    from api.lineage import ForkRequest
    from api.sweeps import SweepSpec

    body = {"name": "s", "base": copy.deepcopy(EXAMPLE), "search": {"params": {"optimizer.lr": [0.1, 0.2]}}}
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(body)
    [item] = format_validation_errors(info.value.errors(), body, SweepSpec.model_json_schema())
    assert item["field"] == "search.params['optimizer.lr']" and "instance of" not in item["msg"]
    assert "exactly one of grid, choice, uniform, loguniform" in item["msg"]
    with pytest.raises(ValidationError) as info:
        ForkRequest.model_validate({"from": 3})
    [item] = format_validation_errors(info.value.errors(), {"from": 3}, ForkRequest.model_json_schema())
    assert item["msg"] == ("Input should be 'latest' or 'scratch'; or Input should be an object {step: N}, N the "
                           "batch of one of the parent's committed checkpoints")


def test_a_long_bad_value_is_echoed_cut_short_by_the_sdk_and_cli_too():
    """A 422 from a service that echoes a value whole (an older one), or the SDK's own check,
    prints 200 characters of it and its length, not all 10,001."""
    line = format_detail([{"field": "notes", "loc": ["body", "notes"], "msg": "at most 10000 characters",
                           "input": "n" * 10_001}])
    assert line == f"notes: at most 10000 characters (got {'n' * 200 + '… (10001 characters in all)'!r})"
    short = format_detail([{"field": "tags", "loc": ["body", "tags"], "msg": "too many", "input": ["a", "b"]}])
    assert short == "tags: too many (got ['a', 'b'])"  # a short value as it is, list and all
    left_out = format_detail([{"field": "data.eval", "loc": ["body", "data", "eval"], "msg": "data.eval is not set, "
                               "but eval_metrics need it", "input": None}])
    assert left_out == "data.eval is not set, but eval_metrics need it"  # no "(got None)" for a field left out
