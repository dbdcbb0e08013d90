"""Algorithm rules that span the spec are refused at submit time: 422, the rule named, nothing stored."""

import pytest

API = "/api/v1"

TEXT_DATA = {"train": {"name": "shakespeare", "seq_len": 64}, "batch_size": 16}


def alibi_on_a_cnn(body):
    body["algorithms"] = [{"name": "alibi"}]


def blurpool_on_text(body):
    body.update(model={"name": "gpt_small"}, data=TEXT_DATA, optimizer={"name": "adamw", "lr": 0.001},
                algorithms=[{"name": "blurpool"}])


def factorize_twice(body):
    body["algorithms"] = [{"name": "factorize"}, {"name": "factorize", "latent_features": 64}]


def stochastic_depth_without_residual_blocks(body):
    body.update(model={"name": "simple_cnn"}, algorithms=[{"name": "stochastic_depth"}])


def stochastic_depth_on_the_wrong_block(body):
    body["algorithms"] = [{"name": "stochastic_depth", "target_layer_name": "ResNetBottleneck"}]


def ghost_batchnorm_without_batchnorm(body):
    body.update(model={"name": "simple_cnn"}, algorithms=[{"name": "ghost_batchnorm"}])


def gyro_dropout_without_dropout(body):
    body["algorithms"] = [{"name": "gyro_dropout"}]


def gated_linear_units_on_a_cnn(body):
    body["algorithms"] = [{"name": "gated_linear_units"}]


def ema_with_swa(body):
    body["algorithms"] = [{"name": "ema"}, {"name": "cutmix"}, {"name": "swa"}]


def selective_backprop_downscaling_text(body):
    body.update(model={"name": "gpt_small"}, data=TEXT_DATA, optimizer={"name": "adamw", "lr": 0.001},
                algorithms=[{"name": "selective_backprop", "scale_factor": 0.5}])


@pytest.mark.parametrize("mutate, field, rule", [
    (alibi_on_a_cnn, "algorithms[0]", "'alibi' needs a transformer model but model 'cifar_resnet20' is a cnn"),
    (blurpool_on_text, "algorithms[0]", "'blurpool' is for vision data but data set 'shakespeare' is text"),
    (factorize_twice, "algorithms", "algorithm 'factorize' is listed twice; list each method once"),
    (stochastic_depth_without_residual_blocks, "algorithms[0]",
     "'stochastic_depth' needs residual blocks but model 'simple_cnn' has none"),
    (stochastic_depth_on_the_wrong_block, "algorithms[0]",
     "target_layer_name 'ResNetBottleneck' is not in model 'cifar_resnet20', whose residual blocks are "
     "CifarResNetBasicBlock"),
    (ghost_batchnorm_without_batchnorm, "algorithms[0]",
     "'ghost_batchnorm' needs BatchNorm layers but model 'simple_cnn' has none"),
    (gyro_dropout_without_dropout, "algorithms[0]",
     "'gyro_dropout' needs torch.nn.Dropout layers but model 'cifar_resnet20' has none"),
    (gated_linear_units_on_a_cnn, "algorithms[0]",
     "'gated_linear_units' needs a transformer model but model 'cifar_resnet20' is a cnn"),
    (ema_with_swa, "algorithms[0]", "'ema' and algorithms[2] 'swa' do not compose"),
    (selective_backprop_downscaling_text, "algorithms[0].scale_factor", "needs image batches"),
])
def test_a_run_breaking_an_algorithm_rule_is_refused_naming_the_field_and_not_stored(client, example_body, mutate,
                                                                                    field, rule):
    mutate(example_body)
    response = client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    assert any(item["field"] == field and rule in item["msg"] for item in response.json()["detail"]), response.json()
    assert client.get(f"{API}/runs").json() == {"data": [], "next_cursor": None}
