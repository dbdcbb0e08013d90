"""The loaders a run trains and evaluates with, chosen by the data set's name.

Built-in data sets (``DATASET_BUILDERS``) are loaded whole into memory and served by
``TensorLoader``; ``image_folder`` and ``webdataset`` are read by DataLoader worker processes, and
your own data set (``import``) by ``UserDataLoader`` (``workers.data.user_data``).
Every loader has the interface the trainer uses: ``len``, iteration, ``set_epoch``,
``exhausted``, ``epoch``, ``batch_in_epoch``, ``sample_transforms``, ``state_dict`` /
``load_state_dict`` (the position in global batches), ``in_channels`` and ``num_classes``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

STREAMED = ("image_folder", "webdataset")


def streamed_only(name: str) -> Any:
    """A ``DATASET_BUILDERS`` entry for a data set that is streamed, never loaded into memory."""

    def refuse(**_: Any) -> Any:
        raise ValueError(f"data set {name!r} is streamed by its loader, not loaded into memory; "
                         "use workers.data.build_train_loader")

    return refuse


def _streamed(dataset: Any, **kwargs: Any) -> Any:
    from workers.data import check_root

    check_root(dataset)  # a local image_folder root or webdataset urls must lie under TESSERA_DATA_DIRS
    if dataset.name == "image_folder":
        from workers.data.image_folder import ImageFolderLoader

        return ImageFolderLoader(dataset, **kwargs)
    from workers.data.webdataset_loader import WebDatasetLoader

    kwargs.pop("drop_last", None)  # streams always take num_samples // batch_size steps
    return WebDatasetLoader(dataset, **kwargs)


def _imported(dataset: Any, field: str, **kwargs: Any) -> Any:
    from workers.data.user_data import UserDataLoader  # imports the user's code: only for it

    return UserDataLoader(dataset, field=field, **kwargs)


def build_train_loader(spec: Any, *, rank: int, world_size: int, device: torch.device | str, seed: int) -> Any:
    """This rank's training loader for ``spec.data`` (a RunSpec's ``data.train``)."""
    from workers.data import TensorLoader, build_dataset, num_classes_of

    data = spec.data
    if data.train.name == "import":
        return _imported(data.train, "data.train", batch_size=data.batch_size, rank=rank, world_size=world_size,
                         train=True, drop_last=data.drop_last, seed=seed, device=device)
    if data.train.name in STREAMED:
        return _streamed(data.train, batch_size=data.batch_size, rank=rank, world_size=world_size, train=True,
                         drop_last=data.drop_last, seed=seed, device=device)
    images, labels = build_dataset(data.train)
    loader = TensorLoader(images, labels, batch_size=data.batch_size, rank=rank, world_size=world_size,
                          drop_last=data.drop_last, seed=seed, device=device)
    loader.num_classes = num_classes_of(data.train)
    return loader


def build_eval_loader(spec: Any, *, rank: int, world_size: int, device: torch.device | str,
                      num_classes: int | None = None, item_shape: tuple[int, ...] | None = None,
                      check_train: Callable[[], int] | None = None) -> Any | None:
    """This rank's evaluation loader (no shuffling, no padding: each example once across ranks), or
    None without ``data.eval``. ``num_classes``: the training loader's, which your own evaluation
    set (``import``) has when neither its spec nor the data set says; ``item_shape``: the
    training set's items' (your own), which your own evaluation set's must have; ``check_train``:
    the training loader's ``check_items``, run before your evaluation set is refused for another
    shape, so that a training set whose own items disagree is named instead."""
    from workers.data import TensorLoader, build_dataset

    data = spec.data
    if data.eval is None:
        return None
    global_batch = data.eval_batch_size or data.batch_size
    per_rank = -(-global_batch // world_size)
    if data.eval.name == "import":
        return _imported(data.eval, "data.eval", batch_size=per_rank * world_size, rank=rank,
                         world_size=world_size, train=False, seed=0, device=device, num_classes=num_classes,
                         shape=item_shape, check_train=check_train)
    if data.eval.name in STREAMED:
        return _streamed(data.eval, batch_size=per_rank * world_size, rank=rank, world_size=world_size,
                         train=False, seed=0, device=device)
    images, labels = build_dataset(data.eval)
    return TensorLoader(images, labels, batch_size=per_rank * world_size, rank=rank, world_size=world_size,
                        shuffle=False, drop_last=False, pad=False, device=device)
