"""Specs of MixUp, CutOut, ColOut, AugMix, ProgressiveResizing, EMA, SWA, GatedLinearUnits and
GyroDropout: ranges, Time fields, the rule that EMA and SWA do not compose, and the models the
surgery methods need."""

import pytest
from pydantic import ValidationError

from api.specs import RunSpec
from api.validation_errors import field_path

BASE = {
    "name": "methods",
    "model": {"name": "simple_cnn"},
    "data": {"train": {"name": "synthetic"}, "batch_size": 32},
    "optimizer": {"name": "sgd", "lr": 0.1},
    "max_duration": "2ep",
}


def spec_with(*algorithms):
    return RunSpec.model_validate({**BASE, "algorithms": list(algorithms)})


def errors_of(*algorithms):
    body = {**BASE, "algorithms": list(algorithms)}
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(body)
    return [(field_path(e["loc"], body), e["msg"], e.get("input")) for e in info.value.errors()]


@pytest.mark.parametrize(("algorithm", "field", "allowed"), [
    ({"name": "colout", "p_row": 1.5}, "algorithms[0].p_row", "less than 1"),
    ({"name": "colout", "p_col": -0.1}, "algorithms[0].p_col", "greater than or equal to 0"),
    ({"name": "mixup", "alpha": 0}, "algorithms[0].alpha", "greater than 0"),
    ({"name": "cutout", "length": 1.5}, "algorithms[0].length", "less than or equal to 1"),
    ({"name": "cutout", "num_holes": 0}, "algorithms[0].num_holes", "greater than or equal to 1"),
    ({"name": "augmix", "severity": 11}, "algorithms[0].severity", "less than or equal to 10"),
    ({"name": "augmix", "augmentation_set": "most"}, "algorithms[0].augmentation_set", "'all', 'safe' or 'original'"),
    ({"name": "progressive_resizing", "initial_scale": 0}, "algorithms[0].initial_scale", "greater than 0"),
    ({"name": "progressive_resizing", "mode": "zoom"}, "algorithms[0].mode", "'resize' or 'crop'"),
    ({"name": "ema", "smoothing": 1.0}, "algorithms[0].smoothing", "less than 1"),
    ({"name": "ema", "half_life": "0.5dur"}, "algorithms[0].half_life", "allowed units here: ba, ep"),
    ({"name": "ema", "ema_start": "3 epochs"}, "algorithms[0].ema_start", "is not a Time string"),
    ({"name": "swa", "swa_start": "100ba"}, "algorithms[0].swa_start", "allowed units here: ep, dur"),
    ({"name": "swa", "anneal_steps": 0}, "algorithms[0].anneal_steps", "greater than or equal to 1"),
    ({"name": "gyro_dropout", "p": 1.0}, "algorithms[0].p", "less than 1"),
    ({"name": "gyro_dropout", "sigma": 0}, "algorithms[0].sigma", "greater than or equal to 1"),
    ({"name": "gated_linear_units", "act_fn": "swish"}, "algorithms[0].act_fn", "'gelu', 'relu', 'silu', 'sigmoid'"),
    ({"name": "swa", "bn_update_batches": 0}, "algorithms[0].bn_update_batches", "greater than or equal to 1"),
    ({"name": "swa", "bn_update_batches": 2_000_000}, "algorithms[0].bn_update_batches",
     "less than or equal to 1000000"),
])
def test_out_of_range_hyperparameters_are_refused_naming_field_value_and_range(algorithm, field, allowed):
    errors = errors_of(algorithm)
    assert any(f.startswith(field) and allowed in msg for f, msg, _ in errors), errors


def test_ema_and_swa_do_not_compose_and_the_error_says_why():
    errors = errors_of({"name": "ema"}, {"name": "swa"})
    messages = [msg for _, msg, _ in errors]
    assert any("'ema' and algorithms[1] 'swa' do not compose" in m and "average of past weights" in m for m in messages), messages


@pytest.mark.parametrize(("algorithm", "message"), [
    ({"name": "ema", "half_life": "10ba", "smoothing": 0.9}, "half_life or smoothing, not both"),
    ({"name": "ema", "half_life": None}, "give half_life"),
    ({"name": "ema", "half_life": "10ba", "update_interval": "1ep"}, "must use the same unit"),
    ({"name": "swa", "swa_start": "0.8dur", "swa_end": "0.5dur"}, "must come after swa_start"),
    ({"name": "swa", "swa_start": "2ep", "swa_end": "0.9dur"}, "must use the same unit"),
    ({"name": "progressive_resizing", "delay_fraction": 0.7, "finetune_fraction": 0.5}, "exceeds 1"),
    ({"name": "colout", "batch": False, "resize_target": True}, "needs batch: true"),
    ({"name": "augmix", "depth": 0}, "depth 0"),
    ({"name": "gyro_dropout", "sigma": 4, "tau": 8}, "tau 8 exceeds sigma 4"),
])
def test_cross_field_rules_of_a_method_are_refused(algorithm, message):
    assert any(message in msg for _, msg, _ in errors_of(algorithm))


def test_defaults_follow_composer_and_time_fields_round_trip_as_strings():
    spec = spec_with({"name": "mixup"}, {"name": "cutout"}, {"name": "colout"}, {"name": "augmix"},
                     {"name": "progressive_resizing"}, {"name": "ema"})
    mixup, cutout, colout, augmix, resizing, ema = spec.algorithms
    assert mixup.alpha == 0.2 and (cutout.num_holes, cutout.length) == (1, 0.5)
    assert (colout.p_row, colout.p_col, colout.batch) == (0.15, 0.15, True)
    assert (augmix.severity, augmix.depth, augmix.width, augmix.alpha) == (3, -1, 3, 1.0)
    assert (resizing.initial_scale, resizing.delay_fraction, resizing.finetune_fraction) == (0.5, 0.5, 0.2)
    dumped = spec.model_dump(mode="json")
    assert dumped["algorithms"][5] == {"name": "ema", "half_life": "1000ba", "smoothing": None,
                                       "ema_start": "0.0dur", "update_interval": None}
    assert RunSpec.model_validate(dumped) == spec
    swa = spec_with({"name": "swa"}).model_dump(mode="json")["algorithms"][0]
    assert (swa["swa_start"], swa["swa_end"], swa["update_interval"]) == ("0.7dur", "0.97dur", "1ep")
    assert swa["bn_update_batches"] is None  # a whole epoch, as torch.optim.swa_utils.update_bn


GPT = {"model": {"name": "gpt_small"}, "data": {"train": {"name": "shakespeare", "seq_len": 64}, "batch_size": 16}}


@pytest.mark.parametrize(("body", "algorithm", "message"), [
    ({}, {"name": "gated_linear_units"},
     "'gated_linear_units' needs a transformer model but model 'simple_cnn' is a cnn"),
    ({"model": {"name": "torchvision", "arch": "resnet50"}}, {"name": "gated_linear_units"},
     "needs a transformer model but model 'torchvision resnet50' is a cnn"),
    ({}, {"name": "gyro_dropout"}, "'gyro_dropout' needs torch.nn.Dropout layers but model 'simple_cnn' has none"),
    ({"model": {"name": "torchvision", "arch": "convnext_tiny"}}, {"name": "gyro_dropout"},
     "model 'torchvision convnext_tiny' has none"),
])
def test_model_changing_methods_are_refused_on_a_built_in_model_without_what_they_change(body, algorithm, message):
    full = {**BASE, **body, "algorithms": [algorithm]}
    with pytest.raises(ValidationError) as info:
        RunSpec.model_validate(full)
    assert any(message in e["msg"] for e in info.value.errors()), info.value.errors()


def test_gated_linear_units_and_gyro_dropout_are_accepted_where_the_model_may_have_what_they_change():
    for body in (GPT, {"model": {"name": "torchvision", "arch": "vit_b_16"}},
                 {"model": {"import": "mypkg.models:build"}}):
        spec = RunSpec.model_validate({**BASE, **body, "algorithms": [{"name": "gated_linear_units"},
                                                                      {"name": "gyro_dropout"}]})
        glu, gyro = spec.algorithms
        assert (glu.act_fn, glu.gated_layer_bias, glu.non_gated_layer_bias) == (None, False, False)  # Composer's
        assert (gyro.p, gyro.sigma, gyro.tau) == (0.5, 256, 16)


def test_ema_smoothing_alone_replaces_the_default_half_life():
    (ema,) = spec_with({"name": "ema", "smoothing": 0.999}).algorithms
    assert ema.half_life is None and ema.smoothing == 0.999
    again = RunSpec.model_validate(spec_with({"name": "ema", "smoothing": 0.999}).model_dump(mode="json"))
    assert again.algorithms[0] == ema


def test_selective_backprop_scores_downscaled_images():
    # The rule against it holds for text only (tests/service/test_algorithm_rules_api.py).
    spec = spec_with({"name": "selective_backprop", "scale_factor": 0.5})
    assert spec.algorithms[0].scale_factor == 0.5
