"""Specs for data a user brings: an image folder, WebDataset tar shards (local or ``s3://``), or
a data set class of their own code package (``{import: "my_project.data:train_set"}``).

Joined into ``api.specs.DatasetSpec``. Like every spec they forbid unknown fields, and each
error names the field, the bad value and what is allowed.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from api.catalog import DATASETS
from api.model_specs import ImportPath, checked_import_path, refuse_unknown_fields, route_import_form
from api.validation_errors import worded_pattern

# Where data may live: a local path, file://, or an S3 bucket (any fsspec store reachable the same way).
_URL = re.compile(r"^(s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?|file://.+|/.+|\./.+|[^:]+)$")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_location(field: str, value: str) -> str:
    if not _URL.match(value):
        raise ValueError(f"{field} {value!r} is not a local path, file:// URL or s3://bucket/prefix URL")
    return value


class NormalizeSpec(_Spec):
    mean: list[float] = Field(..., min_length=1, max_length=4, description="per channel, on images in [0, 1]")
    std: list[float] = Field(..., min_length=1, max_length=4, description="per channel, each > 0")

    @model_validator(mode="after")
    def _same_length(self) -> "NormalizeSpec":
        if len(self.mean) != len(self.std):
            raise ValueError(f"normalize.mean has {len(self.mean)} values but normalize.std has {len(self.std)}; "
                             "give one of each per channel")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"normalize.std {self.std} must be > 0 in every channel")
        return self


class TransformsSpec(_Spec):
    """Per-sample transforms, applied in the data loader's worker processes, in this order."""

    resize: int | None = Field(None, ge=1, le=4096, description="resize so the shorter side has this many pixels")
    crop: int | None = Field(None, ge=1, le=4096,
                             description="square crop of this size: random when training, centred for evaluation")
    hflip: bool = Field(False, description="random horizontal flip (training only)")
    normalize: NormalizeSpec | None = Field(None, description="(x - mean) / std per channel; else x in [0, 1]")


class _ImageDataSpec(_Spec):
    channels: Literal[1, 3] = Field(3, description="decode as grayscale (1) or RGB (3)")
    transforms: TransformsSpec = Field(default_factory=TransformsSpec)
    num_workers: int = Field(2, ge=0, le=32, description="DataLoader worker processes per rank (0: in-process)")

    @model_validator(mode="after")
    def _normalize_matches_channels(self) -> "_ImageDataSpec":
        norm = self.transforms.normalize
        if norm is not None and len(norm.mean) not in (1, self.channels):
            raise ValueError(f"transforms.normalize has {len(norm.mean)} values per statistic but channels is "
                             f"{self.channels}; give 1 or {self.channels}")
        return self


class ImageFolderSpec(_ImageDataSpec):
    """torchvision's ``root/<class>/<image>`` layout; classes are the sorted folder names."""

    name: Literal["image_folder"]
    root: str = Field(..., min_length=1, description="local folder or s3://bucket/prefix holding one folder per class")
    num_classes: int | None = Field(None, ge=2, le=100_000,
                                    description="defaults to the number of class folders under root")

    @field_validator("root")
    @classmethod
    def _root_is_a_location(cls, value: str) -> str:
        return _check_location("root", value)


SAMPLE_KEY_PATTERN = worded_pattern(r"^[A-Za-z0-9_.\-]+$", "letters, digits, '_', '.' and '-'")


class WebDatasetSpec(_ImageDataSpec):
    """WebDataset tar shards, streamed (never downloaded whole); ``tessera data pack`` writes them."""

    name: Literal["webdataset"]
    urls: str = Field(..., min_length=1, description="shard URLs as a brace pattern, e.g. "
                      "s3://bucket/train-{000000..000019}.tar")
    image_key: str = Field("png", min_length=1, max_length=32, pattern=SAMPLE_KEY_PATTERN,
                           description="extension of each sample's image file (png, jpg, ...)")
    label_key: str = Field("cls", min_length=1, max_length=32, pattern=SAMPLE_KEY_PATTERN,
                           description="extension of each sample's label file (an integer as text)")
    num_samples: int = Field(..., ge=1, le=10**10, description="samples in all shards; steps per epoch are "
                             "num_samples // batch_size")
    num_classes: int = Field(10, ge=2, le=100_000, description="labels must lie in [0, num_classes)")
    shuffle_buffer: int = Field(1000, ge=0, le=1_000_000, description="samples held for shuffling (0: none)")

    @field_validator("urls")
    @classmethod
    def _urls_are_shards(cls, value: str) -> str:
        _check_location("urls", value)
        if value.count("{") != value.count("}"):
            raise ValueError(f"urls {value!r} has unbalanced braces; use a pattern like train-{{000000..000019}}.tar")
        return value


class ImportedDataSpec(ImportPath, _Spec):
    """Your own data set: ``import: "package.module:callable"``, shipped in the run's code package.

    Every rank calls it as ``build(**params)``; it returns a map-style ``torch.utils.data.Dataset``.
    ``task: classification`` (the default): items ``(inputs, label)``, an image ``(C, H, W)`` or a
    feature vector ``(F,)`` and an integer label. ``task: language_model``: items ``(tokens,
    targets)``, two integer tensors of ``seq_len`` token ids (targets: the next token of each
    position; -100 where a position counts for nothing, such as padding), text data that counts
    tokens."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    import_path: str = Field(..., alias="import", max_length=512,
                             description="'package.module:callable' returning a map-style torch Dataset of "
                                         "(input tensor, integer label) items, or of (tokens, targets) items "
                                         "for task language_model")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the callable")
    # Both left out of a dump at their defaults: a classification spec stores and compares as it
    # did before tasks existed (idempotent retries, spec diffs of older runs).
    task: Literal["classification", "language_model"] = Field(
        "classification", exclude_if=lambda task: task == "classification",
        description="classification: (inputs, label) items; language_model: (tokens, targets) items of seq_len "
                    "token ids, targets -100 where a position counts for nothing (text data)")
    seq_len: int | None = Field(None, ge=2, le=65536, exclude_if=lambda seq_len: seq_len is None,
                                description="task language_model only, and needed there: tokens per item")
    num_classes: int | None = Field(None, ge=1, le=100_000,
                                    description="labels lie in [0, num_classes) (language_model: token ids, "
                                                "targets also -100 where ignored, and num_classes is the "
                                                "vocabulary size); default: the data set's "
                                                "num_classes attribute")
    num_workers: int = Field(0, ge=0, le=32, description="DataLoader worker processes per rank (0: in-process); "
                                                         "above 0 the data set is pickled to them")

    @model_validator(mode="before")
    @classmethod
    def _only_known_fields(cls, data: Any) -> Any:
        return refuse_unknown_fields(data, ("import", "params", "task", "seq_len", "num_classes", "num_workers"),
                                     what="data set")

    @field_validator("import_path")
    @classmethod
    def _module_colon_callable(cls, path: str) -> str:
        return checked_import_path(path, example="my_project.data:train_set")

    @property
    def name(self) -> str:
        """Not a field: lets code that reads ``spec.data.train.name`` treat every form alike."""
        return "import"


def route_data_spec(value: Any, handler: Any) -> Any:
    """A data set is a named one (``handler``: the union discriminated on ``name``) or, with an
    ``import`` key and no ``name``, an ``ImportedDataSpec`` (as ``api.model_specs.route_model_spec``)."""
    return route_import_form(value, handler, ImportedDataSpec, what="data set")


def dataset_domain(dataset: Any) -> Literal["vision", "text"]:
    """The domain of a data set spec: its catalog entry's, and for your own data set "text" when
    its task is language_model, else "vision" (classification: images or feature vectors)."""
    if isinstance(dataset, ImportedDataSpec):
        return "text" if dataset.task == "language_model" else "vision"
    return DATASETS[dataset.name].domain


def task_problem(dataset: Any, field: str) -> str | None:
    """Why your own data set at ``field`` (``data.train``, ``data.eval``) has a ``seq_len`` that
    does not go with its task, starting with the field's path; None when it fits."""
    if not isinstance(dataset, ImportedDataSpec):
        return None
    if dataset.task == "language_model" and dataset.seq_len is None:
        return f"{field}.seq_len is missing: task 'language_model' needs the tokens in each item (e.g. seq_len: 128)"
    if dataset.task == "classification" and dataset.seq_len is not None:
        return (f"{field}.seq_len {dataset.seq_len} is for task 'language_model' (items of token ids); classification "
                "items take no seq_len: leave it out, or set task: language_model")
    return None


def dataset_label(dataset: Any) -> str:
    """A data set spec as messages name it: ``'digits'``, or ``import 'my_project.data:train_set'``."""
    return f"import {dataset.import_path!r}" if isinstance(dataset, ImportedDataSpec) else repr(dataset.name)


__all__ = ["ImageFolderSpec", "ImportedDataSpec", "NormalizeSpec", "TransformsSpec", "WebDatasetSpec",
           "dataset_domain", "dataset_label", "route_data_spec", "task_problem"]
