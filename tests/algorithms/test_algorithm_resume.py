"""Every method resumes exactly: train k batches, save (model, optimizer, scheduler, data position,
RNG and every algorithm's ``state_dict``), build a fresh trainer, load, train on -- the weights
equal an uninterrupted run's.

Parametrized from the registry: a method registered without an entry in ``RESUME_RUNS`` fails
``test_training_resumed_from_algorithm_state_matches_an_uninterrupted_run``.
"""

import copy

import pytest
import torch

from algorithms.events import Event
from algorithms.registry import ALGORITHM_CLASSES, build_algorithm
from api.algorithm_specs import ALGORITHM_SPECS
from api.specs import RunSpec
from workers.parallel import unwrap
from workers.trainer import Trainer

SIMPLE_CNN = {"name": "simple_cnn", "params": {"width": 8, "hidden": 16}}
RESNET = {"name": "cifar_resnet20", "params": {"width": 4}}  # has BatchNorm
IMAGES = {"train": {"name": "synthetic", "num_samples": 96, "image_size": 8, "num_classes": 4}, "batch_size": 16}
TEXT = {"train": {"name": "shakespeare", "seq_len": 16, "limit": 96}, "batch_size": 16}
GPT = {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 16}}

# name -> (model, data, algorithm spec, total batches, batch to save at). Runs cross an epoch
# boundary (6 batches per epoch) and save while the method is mid-way through its work.
RESUME_RUNS = {
    "channels_last": (SIMPLE_CNN, IMAGES, {"name": "channels_last"}, 8, 4),
    "label_smoothing": (SIMPLE_CNN, IMAGES, {"name": "label_smoothing"}, 8, 4),
    "cutmix": (SIMPLE_CNN, IMAGES, {"name": "cutmix"}, 8, 4),
    "blurpool": (RESNET, IMAGES, {"name": "blurpool", "min_channels": 4}, 8, 4),
    "factorize": (SIMPLE_CNN, IMAGES, {"name": "factorize", "min_channels": 8, "min_features": 16}, 8, 4),
    "alibi": (GPT, TEXT, {"name": "alibi", "max_sequence_length": 32}, 8, 4),
    "mixup": (SIMPLE_CNN, IMAGES, {"name": "mixup", "alpha": 0.4}, 8, 4),
    "cutout": (SIMPLE_CNN, IMAGES, {"name": "cutout"}, 8, 4),
    "colout": (SIMPLE_CNN, IMAGES, {"name": "colout"}, 8, 4),
    "augmix": (SIMPLE_CNN, IMAGES, {"name": "augmix", "width": 2}, 8, 4),
    "progressive_resizing": (SIMPLE_CNN, IMAGES, {"name": "progressive_resizing", "delay_fraction": 0.2,
                                                  "size_increment": 2}, 8, 4),
    "ema": (RESNET, IMAGES, {"name": "ema", "half_life": "2ba", "ema_start": "2ba"}, 8, 4),
    "swa": (RESNET, IMAGES, {"name": "swa", "swa_start": "0.25dur", "swa_end": "0.75dur", "update_interval": "1ba",
                             "schedule_swa_lr": True, "anneal_steps": 2, "swa_lr": 0.01,
                             "bn_update_batches": 3}, 8, 4),
    "gradient_clipping": (RESNET, IMAGES, {"name": "gradient_clipping", "clipping_type": "adaptive",
                                           "clipping_threshold": 0.01}, 8, 4),
    # Freezes at the first epoch end (batch 6), saves at 8, freezes deeper at batch 12.
    "layer_freezing": (SIMPLE_CNN, IMAGES, {"name": "layer_freezing", "freeze_start": 0.0}, 14, 8),
    "stochastic_depth": (RESNET, IMAGES, {"name": "stochastic_depth", "drop_rate": 0.5, "drop_warmup": 0.25}, 8, 4),
    "squeeze_excite": (SIMPLE_CNN, IMAGES, {"name": "squeeze_excite", "latent_channels": 0.5, "min_channels": 8},
                       8, 4),
    "ghost_batchnorm": (RESNET, IMAGES, {"name": "ghost_batchnorm", "ghost_batch_size": 8}, 8, 4),
    "weight_standardization": (SIMPLE_CNN, IMAGES, {"name": "weight_standardization"}, 8, 4),
    "sam": (SIMPLE_CNN, IMAGES, {"name": "sam", "rho": 0.1, "interval": 2}, 8, 4),
    "low_precision_layernorm": (GPT, TEXT, {"name": "low_precision_layernorm"}, 8, 4),
    "low_precision_groupnorm": (SIMPLE_CNN, IMAGES, {"name": "low_precision_groupnorm"}, 8, 4),
    "fused_layernorm": (GPT, TEXT, {"name": "fused_layernorm"}, 8, 4),
    "seq_length_warmup": (GPT, TEXT, {"name": "seq_length_warmup", "duration": 1.0, "min_seq_length": 4,
                                      "max_seq_length": 16, "step_size": 4, "truncate": False}, 8, 4),
    "selective_backprop": (SIMPLE_CNN, IMAGES, {"name": "selective_backprop", "start": 0.25, "end": 1.0,
                                                "interval": 1, "scale_factor": 0.5}, 8, 4),
    "randaugment": (SIMPLE_CNN, IMAGES, {"name": "randaugment", "depth": 1}, 8, 4),
    "gated_linear_units": (GPT, TEXT, {"name": "gated_linear_units", "gated_layer_bias": True}, 8, 4),
    # 8 batches over 4 subnetworks: the active pair changes at batches 2, 4 (the save) and 6.
    "gyro_dropout": (GPT, TEXT, {"name": "gyro_dropout", "sigma": 4, "tau": 2}, 8, 4),
}


def trainer_for(name):
    model, data, algorithm, total, _ = RESUME_RUNS[name]
    return Trainer(RunSpec.model_validate({
        "name": "resume", "model": model, "data": data, "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "scheduler": {"name": "cosine"}, "max_duration": f"{total}ba", "algorithms": [algorithm], "seed": 11,
    }))


def train_batches(trainer, count):
    """``fit``'s loop without evaluation, for ``count`` batches (epoch events included)."""
    state, engine, loader = trainer.state, trainer.engine, trainer.train_loader
    for _ in range(count):
        if state.timestamp.batch_in_epoch == 0:
            loader.set_epoch(state.timestamp.epoch)
            engine.run_event(Event.EPOCH_START, state)
        inputs, targets = next(iter(loader))
        trainer.train_batch(inputs, targets)
        if loader.exhausted:
            state.timestamp = state.timestamp.after_epoch()
            engine.run_event(Event.EPOCH_END, state)


def checkpoint(trainer):
    state = trainer.state
    return copy.deepcopy({
        "model": unwrap(state.model).state_dict(), "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(), "loader": trainer.train_loader.state_dict(),
        "timestamp": state.timestamp, "rng": torch.get_rng_state(),
        "algorithms": [a.state_dict() for a in state.algorithms],
    })


def restore(trainer, saved):
    state = trainer.state
    unwrap(state.model).load_state_dict(saved["model"])
    state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    trainer.train_loader.load_state_dict(saved["loader"])
    state.timestamp = saved["timestamp"]
    for algorithm, algorithm_state in zip(state.algorithms, saved["algorithms"], strict=True):
        algorithm.load_state_dict(copy.deepcopy(algorithm_state))
    torch.set_rng_state(saved["rng"])


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_training_resumed_from_algorithm_state_matches_an_uninterrupted_run(name):
    assert name in RESUME_RUNS, f"{name} has no save/resume run; add one to RESUME_RUNS"
    _, _, _, total, split = RESUME_RUNS[name]
    uninterrupted = trainer_for(name)
    uninterrupted.engine.run_event(Event.FIT_START, uninterrupted.state)
    train_batches(uninterrupted, split)
    saved = checkpoint(uninterrupted)
    train_batches(uninterrupted, total - split)

    resumed = trainer_for(name)  # a fresh process would build exactly this (INIT replays surgery)
    restore(resumed, saved)
    resumed.engine.run_event(Event.FIT_START, resumed.state)
    train_batches(resumed, total - split)

    want, got = unwrap(uninterrupted.state.model).state_dict(), unwrap(resumed.state.model).state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]
    for a, b in zip(uninterrupted.state.algorithms, resumed.state.algorithms):
        assert_same_state(a.state_dict(), b.state_dict())


def assert_same_state(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same_state(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_state(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_algorithm_state_survives_a_round_trip_into_a_fresh_algorithm(name):
    trainer = trainer_for(name)
    trainer.engine.run_event(Event.FIT_START, trainer.state)
    _, _, spec, total, split = RESUME_RUNS[name]
    train_batches(trainer, split)
    (algorithm,) = trainer.state.algorithms
    fresh = build_algorithm(ALGORITHM_SPECS[name].model_validate(spec))
    fresh.load_state_dict(copy.deepcopy(algorithm.state_dict()))
    assert_same_state(fresh.state_dict(), algorithm.state_dict())


def test_ema_and_swa_checkpoints_hold_real_averaged_tensors():
    for name, key in (("ema", "averaged"), ("swa", "averaged")):
        trainer = trainer_for(name)
        trainer.engine.run_event(Event.FIT_START, trainer.state)
        train_batches(trainer, 4)
        held = trainer.state.algorithms[0].state_dict()[key]
        weights = dict(unwrap(trainer.state.model).named_parameters())
        assert held and all(isinstance(t, torch.Tensor) for t in held.values())
        assert set(weights) <= set(held)
        assert any(not torch.equal(held[k], weights[k]) for k in weights)  # an average, not a copy
    swa = trainer.state.algorithms[0].state_dict()
    assert swa["num_averaged"] == 3 and swa["swa_scheduler"] is not None and "anneal_func" not in swa["swa_scheduler"]
