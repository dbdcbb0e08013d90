"""Data set registry: ``build_dataset(spec) -> (images, labels)`` and the sharded ``TensorLoader``.

Names equal ``api.catalog.DATASETS``'s keys. Every data set is a pair of in-memory tensors:
float images ``(N, C, H, W)``, normalized, and int64 labels ``(N,)``; or, for text, int64 token
ids ``(N, T)`` and the next tokens ``(N, T)``.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

from api.catalog import DATASETS
from api.data_roots import ROOT_FIELDS, default_root, root_problem
from workers.data.digits import load_digits
from workers.data.factory import build_eval_loader, build_train_loader, streamed_only
from workers.data.fashion_mnist import load_fashion_mnist
from workers.data.loader import TensorLoader
from workers.data.shakespeare import load_shakespeare
from workers.data.synthetic import make_synthetic

DATASET_BUILDERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    "digits": load_digits,
    "fashion_mnist": load_fashion_mnist,
    "shakespeare": load_shakespeare,
    "synthetic": make_synthetic,
    # Never loaded whole: read by DataLoader workers (workers.data.factory.build_train_loader).
    "image_folder": streamed_only("image_folder"),
    "webdataset": streamed_only("webdataset"),
}


def build_dataset(spec: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(images, labels)`` an ``api.specs.DatasetSpec`` describes."""
    try:
        builder = DATASET_BUILDERS[spec.name]
    except KeyError:
        raise ValueError(f"unknown data set {spec.name!r}; known: {', '.join(sorted(DATASET_BUILDERS))}") from None
    check_root(spec)
    return builder(**spec.model_dump(exclude={"name"}))


def check_root(spec: Any) -> None:
    """Refuse a local ``root`` or ``urls`` shard outside ``TESSERA_DATA_DIRS`` (symlinks resolved,
    each shard of a brace pattern), as the service did at submit: a spec that reached the worker
    another way must not read arbitrary paths. Without ``TESSERA_SERVICE_URL`` (``tessera train``
    on one's own machine) nothing is checked."""
    if not os.environ.get("TESSERA_SERVICE_URL"):
        return
    data_dirs = [d for d in os.environ.get("TESSERA_DATA_DIRS", "").split(":") if d]
    for field in ROOT_FIELDS:
        value = getattr(spec, field, None)
        if not isinstance(value, str):
            continue
        default = default_root(spec, field)
        if field == "urls":
            from workers.data.webdataset_loader import expand_urls  # webdataset's import: only for it

            paths = expand_urls(value)
        else:
            paths = [value]
        for path in paths:
            problem = root_problem(path, default, data_dirs, resolve=True)
            if problem:
                raise PermissionError(f"data set {spec.name!r}: {field} {path!r}: {problem}")


def num_classes_of(spec: Any) -> int:
    """How many classes ``spec``'s data set has (synthetic data sets choose their own)."""
    return getattr(spec, "num_classes", None) or DATASETS[spec.name].num_classes


__all__ = ["DATASET_BUILDERS", "TensorLoader", "build_dataset", "build_eval_loader", "build_train_loader",
           "num_classes_of"]
