"""One pydantic spec per speedup method, joined in a discriminated union on ``name``.

Each spec holds the method's hyperparameters with their allowed ranges; the worker builds
the matching ``Algorithm`` from it (``algorithms.registry``). Adding a method means adding a
spec here, an entry in ``api.catalog.ALGORITHMS`` and a folder under ``algorithms/``; a test
checks the three agree.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class _AlgorithmSpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChannelsLastSpec(_AlgorithmSpecBase):
    """Convert the model's 4-d parameters and buffers to NHWC memory format."""

    name: Literal["channels_last"]


class LabelSmoothingSpec(_AlgorithmSpecBase):
    """Blend one-hot targets with the uniform distribution before the loss."""

    name: Literal["label_smoothing"]
    smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="mass moved to the uniform distribution")


class CutMixSpec(_AlgorithmSpecBase):
    """Paste a random box from a shuffled copy of the batch; mix targets by box area."""

    name: Literal["cutmix"]
    alpha: float = Field(1.0, gt=0.0, description="Beta(alpha, alpha) concentration for the kept area")
    uniform_sampling: bool = Field(False, description="sample box centres so every pixel is equally likely to be cut")


AlgorithmSpec = Annotated[
    Union[ChannelsLastSpec, LabelSmoothingSpec, CutMixSpec],
    Field(discriminator="name"),
]

ALGORITHM_SPECS: dict[str, type[BaseModel]] = {
    spec.model_fields["name"].annotation.__args__[0]: spec  # type: ignore[union-attr]
    for spec in (ChannelsLastSpec, LabelSmoothingSpec, CutMixSpec)
}
