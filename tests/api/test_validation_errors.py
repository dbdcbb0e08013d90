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
