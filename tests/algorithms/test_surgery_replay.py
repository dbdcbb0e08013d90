"""Save -> resume for methods that change the model: the surgery is replayed on a freshly built
model before the saved state dict is loaded, and the resumed model computes the same outputs.

Parametrized from the registry: every surgery method (``changes_model``) is covered; methods
whose default spec does nothing on the small test models get their parameters in ``SPEC_PARAMS``.
"""

import pytest
import torch

from algorithms.registry import ALGORITHM_CLASSES, build_algorithm
from api.algorithm_specs import ALGORITHM_SPECS
from api.catalog import ALGORITHMS
from api.specs import RunSpec
from workers.parallel import unwrap
from workers.trainer import Trainer

SURGERY = sorted(name for name, cls in ALGORITHM_CLASSES.items() if cls.changes_model)

SPEC_PARAMS = {
    "alibi": {"max_sequence_length": 64, "train_sequence_length_scaling": 0.5},
    "factorize": {"min_channels": 32, "min_features": 32},
    "squeeze_excite": {"min_channels": 32, "latent_channels": 8},
    "ghost_batchnorm": {"ghost_batch_size": 8},
}


def run_spec(name: str) -> RunSpec:
    """A 3-batch run where ``name`` has something to change: gpt_small on text (and for methods that
    need a transformer or dropout layers), ResNet-20 on images."""
    algorithm = {"name": name, **SPEC_PARAMS.get(name, {})}
    if ALGORITHMS[name].domain == "text" or {"transformer", "dropout"} & set(ALGORITHMS[name].needs):
        model = {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 32}}
        data = {"train": {"name": "shakespeare", "seq_len": 32, "limit": 64}, "batch_size": 8}
        optimizer = {"name": "adamw", "lr": 0.01}
    else:
        model = {"name": "cifar_resnet20"}
        data = {"train": {"name": "synthetic", "num_samples": 64, "image_size": 8, "num_classes": 4},
                "batch_size": 16}
        optimizer = {"name": "sgd", "lr": 0.05, "momentum": 0.9}
    return RunSpec.model_validate({"name": "replay", "model": model, "data": data, "optimizer": optimizer,
                                   "max_duration": "3ba", "algorithms": [algorithm]})


@pytest.mark.parametrize("name", SURGERY)
def test_resuming_replays_the_surgery_before_loading_the_saved_model(name):
    spec = run_spec(name)
    trained = Trainer(spec)
    trained.fit()
    saved = {k: v.clone() for k, v in unwrap(trained.state.model).state_dict().items()}
    algorithm_state = trained.engine.algorithms[0].state_dict()

    resumed = Trainer(spec)  # builds the model and replays the surgery at INIT
    resumed.engine.algorithms[0].load_state_dict(algorithm_state)
    model = unwrap(resumed.state.model)
    model.load_state_dict(saved, strict=True)
    inputs, _ = next(iter(resumed.train_loader))
    original = unwrap(trained.state.model).eval()
    assert torch.equal(model.eval()(inputs), original(inputs))
    # The optimizer built after the replay optimizes exactly the resumed model's parameters.
    optimized = {id(p) for group in resumed.state.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in model.parameters()}


# Surgery that keeps every state-dict name and shape (a memory format; a class swap with the same
# parameters) loads into an unconverted model by design.
SAME_STATE_DICT = {"channels_last", "low_precision_layernorm", "low_precision_groupnorm", "fused_layernorm"}


@pytest.mark.parametrize("name", [n for n in SURGERY if n not in SAME_STATE_DICT])
def test_a_surgered_checkpoint_does_not_load_into_an_unconverted_model(name):
    spec = run_spec(name)
    saved = unwrap(Trainer(spec).state.model).state_dict()
    plain = Trainer(spec.model_copy(update={"algorithms": []}))
    with pytest.raises(RuntimeError):
        unwrap(plain.state.model).load_state_dict(saved, strict=True)


@pytest.mark.parametrize("name", sorted(ALGORITHM_CLASSES))
def test_algorithm_state_dict_round_trips(name):
    algorithm = build_algorithm(ALGORITHM_SPECS[name](name=name))
    state = algorithm.state_dict()
    fresh = build_algorithm(ALGORITHM_SPECS[name](name=name))
    fresh.load_state_dict(state)
    assert fresh.state_dict().keys() == state.keys()


def test_replays_mark_their_init_as_one_whose_weights_are_loaded(tmp_path):
    """The trainer's INIT is a replay for a fork starting from its parent's checkpoint,
    ``load_model``'s rebuild always is; a fresh run's is not, so factorize computes its ``init`` only there. (Construction only: INIT runs
    in the constructor, and nothing here is loaded.)"""
    from api.lineage import ForkInfo
    from workers.export import rebuild_model
    spec = run_spec("factorize")
    seen = []

    class Record:
        def run_event(self, event, state):
            seen.append(state.loads_weights)
    fresh = Trainer(spec, callbacks=[Record()], checkpoint_url=str(tmp_path / "run"))
    fork = ForkInfo(**{"from": "latest", "checkpoint_url": str(tmp_path / "parent" / "ep0-ba3")})
    Trainer(spec, callbacks=[Record()], fork=fork)
    assert seen[:2] == [False, True] and not fresh.state.loads_weights
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("workers.engine.Engine.run_event", lambda self, event, state: seen.append(state.loads_weights))
        rebuild_model({"tessera.spec": spec.model_dump_json(), "tessera.num_classes": "4",
                       "tessera.in_channels": "3", "tessera.image_size": "8"})
    assert seen[-1] is True
