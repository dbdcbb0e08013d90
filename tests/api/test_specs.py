"""RunSpec validation: good specs pass; every bad one names the field, the value and what is allowed."""

import copy
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from api.specs import RunSpec
from api.validation_errors import field_path

EXAMPLE = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_resnet.yaml").read_text())


def errors_of(body):
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(body)
    return [(field_path(e["loc"], body), e["msg"], e.get("input")) for e in info.value.errors()]


def patched(**changes):
    body = copy.deepcopy(EXAMPLE)
    for dotted, value in changes.items():
        node = body
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return body


def test_the_readme_example_is_a_valid_spec_and_round_trips():
    spec = RunSpec.model_validate(EXAMPLE)
    assert [a.name for a in spec.algorithms] == ["label_smoothing", "channels_last", "cutmix"]
    assert RunSpec.model_validate(spec.model_dump(mode="json")) == spec
    assert spec.model_dump(mode="json")["max_duration"] == "5ep"


def test_defaults_fill_in_params_the_user_left_out():
    spec = RunSpec.model_validate(EXAMPLE)
    assert spec.model.params.width == 16
    assert spec.parallelism.cpus_per_worker == 1
    assert spec.algorithms[2].alpha == 1.0


@pytest.mark.parametrize(
    ("body", "field", "bad_value", "allowed"),
    [
        (patched(max_duration="3 epochs"), "max_duration", "3 epochs", "ep, ba, sp or tok"),
        (patched(optimizer__lr=-0.1), "optimizer.lr", -0.1, "greater than 0"),
        (patched(model={"name": "vit"}), "model", {"name": "vit"},
         "'cifar_resnet20', 'gpt_small', 'resnet18', 'simple_cnn'"),
        (patched(parallelism__num_workers=0), "parallelism.num_workers", 0, "greater than or equal to 1"),
        (patched(algorithms=[{"name": "warp_drive"}]), "algorithms[0]", {"name": "warp_drive"}, "'cutmix'"),
        (patched(algorithms=[{"name": "label_smoothing", "smoothing": 1.5}]), "algorithms[0].smoothing", 1.5,
         "less than 1"),
        (patched(precision="fp8"), "precision", "fp8", "'fp32', 'amp_bf16' or 'amp_fp16'"),
        (patched(max_duration="0.5dur"), "max_duration", "0.5dur", "allowed units here: ep, ba, sp, tok"),
        (patched(learning_rate=0.1), "learning_rate", 0.1, "Extra inputs are not permitted"),
        (patched(data__batch_size=0), "data.batch_size", 0, "greater than or equal to 1"),
    ],
)
def test_bad_specs_name_the_field_the_value_and_what_is_allowed(body, field, bad_value, allowed):
    errors = errors_of(body)
    assert any(f == field and value == bad_value and allowed in msg for f, msg, value in errors), errors


def test_an_algorithm_listed_twice_is_refused():
    errors = errors_of(patched(algorithms=[{"name": "cutmix"}, {"name": "cutmix", "alpha": 0.5}]))
    assert any("'cutmix' is listed twice" in msg for _, msg, _ in errors)


def test_strategy_none_with_several_workers_is_refused():
    errors = errors_of(patched(parallelism={"strategy": "none", "num_workers": 2}))
    assert any("strategy 'none' runs exactly one worker" in msg for _, msg, _ in errors)


def test_a_batch_that_does_not_split_across_workers_is_refused():
    errors = errors_of(patched(data__batch_size=63))
    assert any("63 must be divisible by parallelism.num_workers 2" in msg for _, msg, _ in errors)


def test_a_microbatch_larger_than_the_per_worker_batch_is_refused():
    errors = errors_of(patched(microbatch_size=64))
    assert any("exceeds the per-worker batch 32" in msg for _, msg, _ in errors)
    assert RunSpec.model_validate(patched(microbatch_size=16)).microbatch_size == 16
    assert RunSpec.model_validate(patched(microbatch_size="auto")).microbatch_size == "auto"


def test_train_and_eval_from_different_data_sets_are_refused():
    errors = errors_of(patched(data__eval={"name": "synthetic", "split": "test"}))
    assert any("differs from data.train.name" in msg for _, msg, _ in errors)


# --- algorithm rules across the spec (issue 3) --------------------------------------------

TEXT_RUN = {
    "name": "text",
    "model": {"name": "gpt_small", "params": {"max_seq_len": 128}},
    "data": {"train": {"name": "shakespeare", "seq_len": 128}, "batch_size": 16},
    "optimizer": {"name": "adamw", "lr": 0.001},
    "max_duration": "10ba",
}


def text_run(**changes):
    body = copy.deepcopy(TEXT_RUN)
    body.update(changes)
    return body


def test_a_language_model_run_with_alibi_is_valid():
    spec = RunSpec.model_validate(text_run(algorithms=[{"name": "alibi", "max_sequence_length": 512}]))
    assert spec.algorithms[0].train_sequence_length_scaling == 0.25
    assert spec.model.params.n_head == 4 and spec.data.train.seq_len == 128


def test_alibi_on_a_non_transformer_model_is_refused_naming_the_rule():
    errors = errors_of(patched(algorithms=[{"name": "alibi"}]))
    assert any("algorithms[0] 'alibi' needs a transformer model but model 'cifar_resnet20' is a cnn" in msg
               for _, msg, _ in errors)


@pytest.mark.parametrize("method", ["blurpool", "channels_last", "cutmix"])
def test_vision_methods_on_text_data_are_refused_naming_the_method(method):
    errors = errors_of(text_run(algorithms=[{"name": method}]))
    assert any(f"algorithms[0] {method!r} is for vision data but data set 'shakespeare' is text" in msg
               for _, msg, _ in errors)


def test_surgery_methods_listed_twice_are_refused():
    errors = errors_of(text_run(algorithms=[{"name": "alibi"}, {"name": "alibi", "max_sequence_length": 64}]))
    assert any("'alibi' is listed twice" in msg for _, msg, _ in errors)


def test_sequences_longer_than_the_model_or_alibi_allow_are_refused():
    errors = errors_of(text_run(data={"train": {"name": "shakespeare", "seq_len": 256}, "batch_size": 16}))
    assert any("data.train.seq_len 256 exceeds model.params.max_seq_len 128" in msg for _, msg, _ in errors)
    longer = text_run(data={"train": {"name": "shakespeare", "seq_len": 256}, "batch_size": 16},
                      algorithms=[{"name": "alibi", "max_sequence_length": 1024}])
    assert RunSpec.model_validate(longer).data.train.seq_len == 256  # ALiBi's positions extend the model's
    errors = errors_of(text_run(algorithms=[{"name": "alibi", "max_sequence_length": 64}]))
    assert any("data.train.seq_len 128 exceeds algorithm 'alibi' max_sequence_length 64" in msg
               for _, msg, _ in errors)


@pytest.mark.parametrize("algorithm, field, allowed", [
    ({"name": "alibi", "train_sequence_length_scaling": 0.0}, "algorithms[0].train_sequence_length_scaling",
     "greater than 0"),
    ({"name": "alibi", "max_sequence_length": 1}, "algorithms[0].max_sequence_length", "greater than or equal to 2"),
    ({"name": "blurpool", "replace_convs": False, "replace_maxpools": False}, "algorithms[0]", "change nothing"),
    ({"name": "blurpool", "min_channels": 0}, "algorithms[0].min_channels", "greater than or equal to 1"),
    ({"name": "factorize", "latent_features": 0.5}, "algorithms[0].latent_features", "(0, 0.5)"),
    ({"name": "factorize", "latent_channels": 0}, "algorithms[0].latent_channels", ">= 1"),
    ({"name": "factorize", "init": "qr"}, "algorithms[0].init", "'random', 'lowrank' or 'svd'"),
])
def test_surgery_method_params_are_range_checked(algorithm, field, allowed):
    errors = errors_of(patched(algorithms=[algorithm]))
    assert any(path == field and allowed in msg for path, msg, _ in errors), errors


def test_gpt_heads_must_divide_the_width():
    errors = errors_of(text_run(model={"name": "gpt_small", "params": {"d_model": 100, "n_head": 8}}))
    assert any("d_model 100 must be divisible by n_head 8" in msg for _, msg, _ in errors)


def test_the_shakespeare_alibi_example_is_a_valid_spec():
    body = yaml.safe_load((Path(__file__).parents[2] / "examples" / "shakespeare_gpt_alibi.yaml").read_text())
    spec = RunSpec.model_validate(body)
    assert spec.model.name == "gpt_small" and [a.name for a in spec.algorithms] == ["alibi"]


def test_a_stored_spec_that_sets_a_field_refused_at_submit_still_loads():
    """Runs stored before the submit check (api.specs.ignored_field_problems) must still resume,
    continue and export: RunSpec accepts what the route refuses."""
    from api.specs import ignored_field_problems

    body = patched(data__num_loader_workers=2, data__drop_last=False,
                   data__train={"name": "webdataset", "urls": "s3://bucket/train-{0..3}.tar", "num_samples": 64},
                   data__eval=None)
    spec = RunSpec.model_validate(body)
    assert [field for field, _, _ in ignored_field_problems(spec)] == ["data.num_loader_workers", "data.drop_last"]


def test_a_stored_spec_that_no_worker_could_run_still_loads_and_the_submit_check_names_it():
    """Runs stored before api.specs.unrunnable_problems (a batch larger than the data, tokens on
    images) must still load to resume, continue and export; the check is the routes' alone."""
    from api.specs import unrunnable_problems

    spec = RunSpec.model_validate(patched(data__batch_size=4000, max_duration="1000tok",
                                          checkpoint={"interval": "100tok"}))
    assert [(field, value) for field, value, _ in unrunnable_problems(spec)] == [
        ("data.batch_size", 4000), ("max_duration", "1000tok"), ("checkpoint.interval", "100tok")]
    assert unrunnable_problems(RunSpec.model_validate(patched(data__batch_size=4000, data__drop_last=False))) == []
