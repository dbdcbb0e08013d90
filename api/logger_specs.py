"""Experiment loggers a run also writes to, besides Tessera's own metric store (``RunSpec.loggers``)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class TensorBoardLoggerSpec(BaseModel):
    """TensorBoard event files under the run's storage prefix, ``{storage}/runs/{id}/tensorboard/``."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["tensorboard"]


class MLflowLoggerSpec(BaseModel):
    """An MLflow run in ``experiment`` on the tracking server at ``tracking_uri``: metrics, the
    flattened spec as params, and the spec's tags."""

    model_config = ConfigDict(extra="forbid")
    name: Literal["mlflow"]
    tracking_uri: str = Field(..., min_length=1, max_length=2048, description="e.g. http://mlflow:5000")
    experiment: str = Field("tessera", min_length=1, max_length=256, description="created if missing")


LoggerSpec = Annotated[Union[TensorBoardLoggerSpec, MLflowLoggerSpec], Field(discriminator="name")]
