"""The model's outputs on the first training batch, checked against the default loss's logits
``(N, num_classes)`` (``workers.output_check``): a clear error naming the model's field, the shape
seen and the one expected, instead of PyTorch's bare ``IndexError: Target 1 is out of bounds.``"""

from __future__ import annotations

import pytest
import torch

from api.model_specs import ImportedModelSpec, TorchvisionModelSpec
from api.specs import RunSpec
from tests.workers.byo_helpers import importable_user_package, user_spec
from workers.errors import describe
from workers.loss import soft_cross_entropy
from workers.models.code_cache import UserCodeError
from workers.output_check import model_field, num_classes_source, outputs_problem
from workers.trainer import Trainer

# A model without a loss of its own: the default loss reads its outputs, ``outputs`` columns of them.
PLAIN = '''
import torch.nn as nn


def build(num_classes, in_channels, outputs=None):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 8 * 8, outputs or num_classes))
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``my_project`` (``tests.workers.byo_helpers``, plus ``plain.py``) importable, forgotten after the test."""
    with importable_user_package(tmp_path / "src", monkeypatch) as package:
        (package / "plain.py").write_text(PLAIN)
        yield


def plain_run(outputs: int | None, **data) -> RunSpec:
    """``my_project.plain:build`` on the package's 4-class data sets, for 2 batches."""
    body = user_spec("outputs", None, user_data=True, batches=2)
    body["model"] = {"import": "my_project.plain:build", "params": {"outputs": outputs}}
    body["data"]["train"].update(data)
    return RunSpec.model_validate(body)


def test_a_model_with_one_output_for_four_classes_fails_naming_model_import_the_shapes_and_num_classes(user_package):
    trainer = Trainer(plain_run(1))
    with pytest.raises(UserCodeError) as caught:
        trainer.fit()
    assert describe(caught.value) == (
        "UserCodeError: model.import 'my_project.plain:build': forward returned outputs of shape (16, 1) on the first "
        "training batch, but the loss needs logits (N, num_classes) = (16, 4) (num_classes 4 comes from the data: the "
        "num_classes attribute of the data set of data.train.import 'my_project.data:train_set'); return one logit "
        "per class: the model is built with num_classes=4")
    assert trainer.state.timestamp.batch == 0  # no step was taken


def test_too_many_outputs_are_refused_too_and_the_spec_num_classes_is_named(user_package):
    """Ten logits on four classes train without an error in PyTorch, on the wrong count of classes."""
    with pytest.raises(UserCodeError, match=r"shape \(16, 10\) on the first training batch, but the loss needs logits "
                                            r"\(N, num_classes\) = \(16, 4\) \(num_classes 4 comes from the data: "
                                            r"data.train.num_classes\)"):
        Trainer(plain_run(10, num_classes=4)).fit()


def test_the_right_shape_trains_and_after_the_first_step_the_loss_is_called_directly(user_package):
    """The check costs nothing per step: it puts the loss itself back in ``state.loss_fn`` on its first call."""
    trainer = Trainer(plain_run(None))
    assert trainer.state.loss_fn is not soft_cross_entropy  # the checking loss, until the first step
    assert trainer.fit()["time/batch"] == 2
    assert trainer.state.loss_fn is soft_cross_entropy


def test_a_model_with_its_own_loss_is_not_checked(user_package):
    """``my_project.nets``'s TinyMLP defines ``loss``: its outputs are read by its own loss, unchecked."""
    body = user_spec("own-loss", None, user_data=True, batches=1)
    trainer = Trainer(RunSpec.model_validate(body))
    assert trainer.state.loss_fn.__func__.__qualname__ == "TinyMLP.loss"


@pytest.mark.parametrize("outputs, targets, text, problem", [
    ((16, 3), torch.zeros(16, dtype=torch.long), False, None),
    ((16, 3), torch.full((16, 3), 1 / 3), False, None),  # CutMix, MixUp, label smoothing: probabilities
    ((16, 1), torch.zeros(16, dtype=torch.long), False, "outputs of shape (16, 1)"),
    ((16, 3, 1, 1), torch.zeros(16, dtype=torch.long), False, "outputs of shape (16, 3, 1, 1)"),
    ((16, 5), torch.full((16, 3), 1 / 3), False, "(N, num_classes) = (16, 3)"),
    ((4, 32, 65), torch.zeros(4, 32, dtype=torch.long), True, None),  # gpt_small's (N, T, V)
    ((4, 32, 65), torch.full((4, 32, 65), 1 / 65), True, None),  # label smoothing on text
    ((4, 32, 128), torch.zeros(4, 32, dtype=torch.long), True, None),  # a padded vocabulary
    ((4, 32, 64), torch.zeros(4, 32, dtype=torch.long), True, "(N, T, vocab_size) = (4, 32, 65)"),
    ((4, 65), torch.zeros(4, 32, dtype=torch.long), True, "outputs of shape (4, 65)"),
])
def test_outputs_are_checked_against_the_logits_the_default_loss_reads(outputs, targets, text, problem):
    num_classes = 65 if text else 3
    found = outputs_problem(torch.zeros(outputs), targets, num_classes=num_classes, text=text)
    assert found is None if problem is None else problem in found


def test_outputs_that_are_no_tensor_are_named_by_their_type():
    found = outputs_problem((torch.zeros(2, 3),), torch.zeros(2, dtype=torch.long), num_classes=3, text=False)
    assert found == ("forward returned a tuple on the first training batch, but the loss needs logits "
                     "(N, num_classes) = (2, 3)")


def test_messages_name_the_models_field_and_where_num_classes_comes_from():
    assert model_field(ImportedModelSpec.model_validate({"import": "my_project.nets:build"})) == (
        "model.import 'my_project.nets:build'")
    assert model_field(TorchvisionModelSpec(name="torchvision", arch="resnet18")) == (
        "model.name 'torchvision' (arch 'resnet18')")
    spec = RunSpec.model_validate(user_spec("sources", None))
    assert model_field(RunSpec.model_validate({**user_spec("x", None), "model": {"name": "simple_cnn"}}).model) == (
        "model.name 'simple_cnn'")
    assert num_classes_source(spec.data.train) == "data.train.num_classes"  # synthetic: the spec's
    fashion = RunSpec.model_validate({**user_spec("x", None), "data": {"train": {"name": "fashion_mnist"},
                                                                       "batch_size": 16}})
    assert num_classes_source(fashion.data.train) == "data set 'fashion_mnist'"
