"""The model's outputs on the first training batch, checked against the default loss's contract.

The default loss (``workers.loss.soft_cross_entropy``) reads logits ``(N, C)``, C the data's
``num_classes`` (text: ``(N, T, V)``, V the vocabulary, or more: a padded vocabulary). Outputs of
another shape fail inside PyTorch with a bare ``IndexError: Target 1 is out of bounds.`` (on a GPU
a device-side assert, after which the process cannot use it), or train silently when C is too
large. Checked once, on the first call of the loss: ``check_first_outputs`` puts a checking loss
in ``state.loss_fn`` that puts the loss itself back on its first call, so every later step calls
the loss directly and pays nothing (``bench/loop.py``). A model with its own ``loss``
(``workers.models.user_code.loss_of``) is not checked: what its loss reads is its own contract.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from api.data_specs import ImportedDataSpec
from api.model_specs import ImportedModelSpec
from workers.state import State


def expected_logits(targets: torch.Tensor, num_classes: int) -> tuple[int, ...]:
    """The shape of the logits the default loss takes for ``targets``: one row per class index
    (``(N,)``, text ``(N, T)``) or per row of class probabilities (``(N, C)``, text ``(N, T, C)``)."""
    rows = targets.shape[:-1] if targets.is_floating_point() else targets.shape
    return (*rows, num_classes)


def outputs_problem(outputs: Any, targets: torch.Tensor, *, num_classes: int, text: bool) -> str | None:
    """What is wrong with ``outputs`` as the default loss's logits for ``targets``, or None."""
    expected = expected_logits(targets, num_classes)
    needs = f"the loss needs logits {'(N, T, vocab_size)' if text else '(N, num_classes)'} = {expected}"
    if not isinstance(outputs, torch.Tensor):
        return f"forward returned a {type(outputs).__name__} on the first training batch, but {needs}"
    shape = tuple(outputs.shape)
    if shape != expected and not _padded_vocabulary(shape, expected, targets):
        return f"forward returned outputs of shape {shape} on the first training batch, but {needs}"
    return None


def _padded_vocabulary(shape: tuple[int, ...], expected: tuple[int, ...], targets: torch.Tensor) -> bool:
    """Text logits over a larger vocabulary than the data's (padded, e.g. to a multiple of 64, as
    GPT-2's 50304): token-id targets never name the extra ids, so the loss reads them as they are."""
    return (len(expected) == 3 and not targets.is_floating_point() and len(shape) == 3
            and shape[:2] == expected[:2] and shape[2] > expected[2])


def model_field(model: Any) -> str:
    """The model as the spec names it: ``model.import '...'``, ``model.name '...'`` (and its ``arch``)."""
    if isinstance(model, ImportedModelSpec):
        return f"model.import {model.import_path!r}"
    arch = getattr(model, "arch", None)
    return f"model.name {model.name!r}" + (f" (arch {arch!r})" if arch else "")


def num_classes_source(train: Any) -> str:
    """Where the run's ``num_classes`` comes from: the spec's ``data.train.num_classes``, your own
    data set's attribute, an image folder's class folders or a built-in data set."""
    if isinstance(train, ImportedDataSpec):
        if train.num_classes is not None:
            return "data.train.num_classes"
        return f"the num_classes attribute of the data set of data.train.import {train.import_path!r}"
    if getattr(train, "num_classes", None) is not None:
        return "data.train.num_classes"
    if train.name == "image_folder":
        return "the class folders under data.train.root"
    return f"data set {train.name!r}"


def outputs_error(problem: str, *, spec: Any, num_classes: int, text: bool) -> Exception:
    """The run's error for ``problem``: the model's field, what it returned and was expected, and
    where ``num_classes`` comes from (the data), and for your own model what to return."""
    from workers.models.code_cache import UserCodeError  # only on failure: it imports the model registry

    what = "vocab_size" if text else "num_classes"
    message = (f"{model_field(spec.model)}: {problem} ({what} {num_classes} comes from the data: "
               f"{num_classes_source(spec.data.train)})")
    if isinstance(spec.model, ImportedModelSpec):
        message += (f"; return one logit per {'token of the vocabulary' if text else 'class'}: the model is built "
                    f"with {what}={num_classes}")
    return UserCodeError(message)


def check_first_outputs(state: State, *, spec: Any, text: bool) -> None:
    """Make ``state.loss_fn`` check its first outputs (``outputs_problem``) and then step aside."""
    loss_fn: Callable[..., torch.Tensor] = state.loss_fn

    def first_loss(outputs: Any, targets: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if state.loss_fn is first_loss:
            state.loss_fn = loss_fn  # later steps call the loss itself
        problem = outputs_problem(outputs, targets, num_classes=state.num_classes, text=text)
        if problem is not None:
            raise outputs_error(problem, spec=spec, num_classes=state.num_classes, text=text)
        return loss_fn(outputs, targets, **kwargs)

    state.loss_fn = first_loss
