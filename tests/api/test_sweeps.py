"""SweepSpec: expanding algorithm sets, skipping invalid combinations, param paths, Pareto front."""

import copy
import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from api import catalog
from api.sweeps import SweepSpec, algorithm_sets, pareto_front, trial_spec

BASE = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_resnet.yaml").read_text())


def sweep(**changes):
    body = {"name": "recipes", "base": copy.deepcopy(BASE),
            "search": {"algorithms": {"pool": ["channels_last", "label_smoothing", "cutmix"], "max_size": 2}}}
    body.update(changes)
    return body


def error_text(body) -> str:
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(body)
    return str(info.value)


def test_a_pool_expands_to_every_subset_up_to_max_size_including_the_baseline():
    spec = SweepSpec.model_validate(sweep())
    sets, skipped = algorithm_sets(spec)
    assert skipped == []
    assert sets == [(), ("channels_last",), ("label_smoothing",), ("cutmix",),
                    ("channels_last", "label_smoothing"), ("channels_last", "cutmix"), ("label_smoothing", "cutmix")]


def test_explicit_sets_are_used_as_given():
    spec = SweepSpec.model_validate(sweep(search={"algorithms": {"sets": [["cutmix"], []]}}))
    assert algorithm_sets(spec)[0] == [("cutmix",), ()]


def test_a_trial_keeps_the_base_hyperparameters_of_methods_the_base_lists_and_applies_params():
    spec = SweepSpec.model_validate(sweep())
    trial = trial_spec(spec.base, ("label_smoothing", "cutmix"), {"optimizer.lr": 0.05, "algorithms.cutmix.alpha": 0.2},
                       name="t1")
    assert trial.name == "t1" and trial.optimizer.lr == 0.05
    assert [(a.name, getattr(a, "smoothing", None)) for a in trial.algorithms][0] == ("label_smoothing", 0.1)
    assert trial.algorithms[1].alpha == 0.2


def test_an_unknown_method_in_the_pool_is_refused_with_the_known_ones():
    message = error_text(sweep(search={"algorithms": {"pool": ["cutmix", "warp_drive"], "max_size": 1}}))
    assert "'warp_drive'" in message and "channels_last" in message


def test_a_param_path_missing_from_the_base_spec_is_refused():
    message = error_text(sweep(search={"params": {"optimizer.learning_rate": {"grid": [0.1]}}}))
    assert "optimizer.learning_rate" in message and "not a field of the base RunSpec" in message


def test_a_param_for_a_method_outside_every_set_is_refused():
    body = sweep(search={"algorithms": {"sets": [["cutmix"]]},
                         "params": {"algorithms.label_smoothing.smoothing": {"choice": [0.1]}}})
    assert "in no algorithm set" in error_text(body)


def test_a_param_value_the_run_spec_would_refuse_is_refused():
    message = error_text(sweep(search={"params": {"optimizer.lr": {"uniform": [-1.0, 0.5]}}}))
    assert "value -1.0 is not allowed" in message and "greater than 0" in message


def test_a_domain_must_be_exactly_one_kind_with_ordered_positive_bounds():
    assert "exactly one of" in error_text(sweep(search={"params": {"optimizer.lr": {"grid": [0.1], "choice": [1]}}}))
    assert "must be positive" in error_text(sweep(search={"params": {"optimizer.lr": {"loguniform": [0.0, 1.0]}}}))
    assert "low < high" in error_text(sweep(search={"params": {"optimizer.lr": {"uniform": [0.5, 0.1]}}}))


def test_sets_that_break_a_rule_are_skipped_and_listed_and_a_sweep_where_all_do_is_refused(monkeypatch):
    # Declare a conflict between two methods for this test only.
    monkeypatch.setitem(catalog.ALGORITHMS, "cutmix",
                        dataclasses.replace(catalog.ALGORITHMS["cutmix"], conflicts=("channels_last",)))
    base = copy.deepcopy(BASE)
    base["algorithms"] = []
    sets, skipped = algorithm_sets(SweepSpec.model_validate(sweep(base=base)))
    assert ("channels_last", "cutmix") not in sets and len(sets) == 6
    assert [s for s, _ in skipped] == [("channels_last", "cutmix")]
    assert "'cutmix' and algorithms[0] 'channels_last' do not compose" in skipped[0][1]

    message = error_text(sweep(base=base, search={"algorithms": {"sets": [["cutmix", "channels_last"]]}}))
    assert "every algorithm set breaks a rule" in message


def test_the_pareto_front_keeps_only_undominated_trials():
    points = {"fast-bad": (0.80, 10.0), "slow-good": (0.95, 60.0), "dominated": (0.79, 20.0),
              "middle": (0.90, 30.0), "tie-slower": (0.90, 31.0), "nan": (float("nan"), 1.0)}
    assert pareto_front(points, "max") == ["fast-bad", "middle", "slow-good"]
    assert pareto_front({"a": (0.5, 10.0), "b": (0.4, 20.0)}, "min") == ["a", "b"]


# --- ASHA's grace period and what it decides on ----------------------------------------

def test_asha_grace_period_is_a_fraction_of_the_base_duration():
    from api.sweeps import grace_fraction

    spec = SweepSpec.model_validate(sweep(scheduler={"name": "asha", "grace_period": "1ep"}))
    assert grace_fraction(spec) == pytest.approx(1 / int(BASE["max_duration"].removesuffix("ep")))
    spec = SweepSpec.model_validate(sweep(scheduler={"name": "asha", "grace_period": "0.25dur"}))
    assert grace_fraction(spec) == 0.25


def test_asha_grace_period_in_another_unit_than_the_duration_is_refused():
    message = error_text(sweep(scheduler={"name": "asha", "grace_period": "10ba"}))
    assert "scheduler.grace_period 10ba" in message and "unit of base.max_duration" in message


def test_asha_grace_period_as_long_as_the_run_is_refused():
    message = error_text(sweep(scheduler={"name": "asha", "grace_period": BASE["max_duration"]}))
    assert "less than base.max_duration" in message


def test_asha_without_evaluations_is_refused_because_it_has_nothing_to_decide_on():
    body = sweep(scheduler={"name": "asha", "grace_period": "1ep"})
    body["base"].pop("eval_interval", None)
    message = error_text(body)
    assert "base.eval_interval is not set" in message


def test_fifo_needs_no_evaluation_interval():
    body = sweep()
    body["base"].pop("eval_interval", None)
    assert SweepSpec.model_validate(body).scheduler.name == "fifo"


@pytest.mark.parametrize(("key", "mode"), [("eval/accuracy", "max"), ("eval/loss", "min"), ("train/loss", "min"),
                                           ("eval/perplexity", "min"), ("throughput/samples_per_sec", "max"),
                                           ("time/wall_s", "min")])
def test_metric_mode_says_which_way_is_better(key, mode):
    from api.views import metric_mode

    assert metric_mode(key) == mode


def test_a_metric_the_scheduler_never_sees_is_refused_with_the_allowed_ones():
    message = error_text(sweep(metric="train/loss"))
    assert "train/loss" in message and "eval/accuracy" in message and "eval/loss" in message


@pytest.mark.parametrize("path, domain", [("data.batch_size", {"loguniform": [16, 128]}), ("seed", {"uniform": [1, 9]})])
def test_a_range_over_an_integer_field_is_refused_before_any_trial_fails(path, domain):
    # Both ends are whole numbers and pass; what a trial would draw between them is a fraction.
    message = error_text(sweep(search={"params": {path: domain}}))
    assert "drawn from inside the range" in message and f"{path}: Input should be a valid integer" in message
    assert "search an integer field with grid or choice" in message


def test_a_searched_value_that_breaks_a_nested_field_names_that_field():
    message = error_text(sweep(search={"params": {"optimizer.name": {"choice": ["sgd", "adam"]}}}))
    assert "value 'adam' is not allowed: optimizer.momentum: Extra inputs are not permitted" in message


def test_a_range_needs_finite_bounds():
    assert "must be finite numbers" in error_text(sweep(search={"params": {"optimizer.lr": {"uniform": [0.1, math.inf]}}}))


def test_a_searched_value_that_breaks_two_cross_field_rules_is_one_item_naming_the_searched_field():
    from api.validation_errors import format_validation_errors

    base = {**copy.deepcopy(BASE), "microbatch_size": 32}
    body = sweep(base=base, search={"params": {"parallelism.num_workers": {"grid": [3]}}})
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(body)
    [item] = format_validation_errors(info.value.errors(), body, SweepSpec.model_json_schema())
    assert item["field"] == "search.params['parallelism.num_workers']" and "\n" not in item["msg"]
    assert "value 3 is not allowed: data.batch_size 64 must be divisible" in item["msg"]
    assert "microbatch_size 32 exceeds" in item["msg"]


# --- how a refused parameter is named ----------------------------------------------------
# A params key is a dotted path into the base, one key: every refusal names it the same way,
# in brackets when it has a dot (search.params['optimizer.lr']), dotted when it is a plain name,
# whether the domain's own validation or the sweep's check of the base refused it.

REFUSED_PARAMS = {
    "a_grid_value_the_base_refuses": ({"optimizer.lr": {"grid": [-0.1]}}, "search.params['optimizer.lr']",
                                      {"grid": [-0.1]},
                                      "value -0.1 is not allowed: optimizer.lr: Input should be greater than 0"),
    "a_grid_that_is_no_list": ({"optimizer.lr": {"grid": "0.1"}}, "search.params['optimizer.lr'].grid", "0.1",
                               "Input should be a valid list"),
    "an_empty_grid": ({"optimizer.lr": {"grid": []}}, "search.params['optimizer.lr'].grid", [], "at least 1 item"),
    "two_domains": ({"optimizer.lr": {"grid": [0.1], "choice": [0.2]}}, "search.params['optimizer.lr']",
                    {"grid": [0.1], "choice": [0.2]}, "give exactly one of grid, choice"),
    "a_path_the_base_lacks": ({"optimizer.nope": {"grid": [1]}}, "search.params['optimizer.nope']", {"grid": [1]},
                              "'optimizer.nope' is not a field of the base RunSpec"),
    "an_algorithm_field_the_method_lacks": ({"algorithms.cutmix.nope": {"grid": [1]}},
                                            "search.params['algorithms.cutmix.nope']", {"grid": [1]},
                                            "'cutmix' has no hyperparameter 'nope'"),
    "a_plain_key_the_base_refuses": ({"max_duration": {"grid": ["soon"]}}, "search.params.max_duration",
                                     {"grid": ["soon"]}, "value 'soon' is not allowed"),
    "a_plain_key_s_empty_grid": ({"max_duration": {"grid": []}}, "search.params.max_duration.grid", [],
                                 "at least 1 item"),
}


def _refused_items(params: dict) -> tuple[dict, list[dict]]:
    from api.validation_errors import format_validation_errors

    body = sweep(search={"params": params})
    with pytest.raises(ValidationError) as info:
        SweepSpec.model_validate(body)
    return body, format_validation_errors(info.value.errors(), body, SweepSpec.model_json_schema())


@pytest.mark.parametrize("case", REFUSED_PARAMS)
def test_a_refused_param_is_named_by_its_key_whichever_rule_refused_it(case):
    from api.errors import format_detail

    params, field, value, words = REFUSED_PARAMS[case]
    _, [item] = _refused_items(params)
    assert (item["field"], item["input"]) == (field, value) and words in item["msg"], item
    assert not item["msg"].startswith("search.params"), item  # the field is named once, as the field
    assert format_detail([item]) == f"{field}: {item['msg']} (got {value!r})"


SEVERAL_REFUSED_PARAMS = {
    "model.widht": {"grid": [8]},  # a path the base lacks...
    "seed": {"grid": [1, 2]},  # (one the base has, with values it accepts: not named)
    "optimizer.lrr": {"grid": [0.1]},  # ...another...
    "optimizer.lr": {"grid": [-0.1]},  # ...and a value the base refuses
}
SEVERAL_REFUSED_ITEMS = [
    ("search.params['model.widht']", {"grid": [8]}, "'model.widht' is not a field of the base RunSpec"),
    ("search.params['optimizer.lrr']", {"grid": [0.1]}, "'optimizer.lrr' is not a field of the base RunSpec"),
    ("search.params['optimizer.lr']", {"grid": [-0.1]},
     "value -0.1 is not allowed: optimizer.lr: Input should be greater than 0"),
]


def test_every_refused_param_is_an_item_of_its_own_not_only_the_first():
    from api.errors import format_detail

    _, items = _refused_items(SEVERAL_REFUSED_PARAMS)
    assert [(i["field"], i["input"]) for i in items] == [(f, v) for f, v, _ in SEVERAL_REFUSED_ITEMS], items
    for item, (field, value, words) in zip(items, SEVERAL_REFUSED_ITEMS):
        assert words in item["msg"] and "\n" not in item["msg"], item
        assert format_detail([item]) == f"{field}: {item['msg']} (got {value!r})"  # each worded as one alone


def test_the_sweep_s_own_rule_and_the_domain_s_validation_name_a_dotted_key_alike():
    _, [by_the_sweep] = _refused_items({"optimizer.lr": {"grid": [-0.1]}})
    _, [by_the_domain] = _refused_items({"optimizer.lr": {"uniform": [0.1, "x"]}})
    assert by_the_sweep["field"] == "search.params['optimizer.lr']"
    assert by_the_domain["field"] == "search.params['optimizer.lr'].uniform[1]"
    assert by_the_domain["field"].startswith(by_the_sweep["field"])


def test_the_422_of_post_sweeps_names_the_refused_params_by_their_keys(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from tests.conftest import ADMIN_HEADERS
    from tests.service.conftest import FakeJobs

    settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000")
    with TestClient(create_app(settings, jobs=FakeJobs(), run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        for case in ("a_grid_value_the_base_refuses", "a_grid_that_is_no_list", "a_path_the_base_lacks",
                     "a_plain_key_the_base_refuses"):
            params, field, value, words = REFUSED_PARAMS[case]
            response = client.post("/api/v1/sweeps", json=sweep(search={"params": params}))
            assert response.status_code == 422, response.text
            [item] = response.json()["detail"]
            assert (item["field"], item["input"]) == (field, value) and words in item["msg"], item
        response = client.post("/api/v1/sweeps", json=sweep(search={"params": SEVERAL_REFUSED_PARAMS}))
        assert response.status_code == 422, response.text
        items = response.json()["detail"]
        assert [(i["field"], i["input"]) for i in items] == [(f, v) for f, v, _ in SEVERAL_REFUSED_ITEMS], items
        assert all(words in i["msg"] for i, (_, _, words) in zip(items, SEVERAL_REFUSED_ITEMS)), items
        assert client.get("/api/v1/sweeps").json() == {"data": [], "next_cursor": None}


def test_the_example_sweep_validates_and_its_metric_is_reported():
    from pathlib import Path

    import yaml

    from api.sweeps import SweepSpec, metric_problems, trial_count

    body = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_sweep.yaml").read_text())
    spec = SweepSpec.model_validate(body)
    assert metric_problems(spec) == [] and spec.mode == "max"
    assert trial_count(spec.search, spec.num_samples) == 8
