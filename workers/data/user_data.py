"""Your own data set: ``data.train: {import: "my_project.data:train_set", params: {...}}``.

The contract:

- The callable is imported from the run's code package (``workers.models.user_code.load_callable``,
  as ``model.import`` is) and called on every rank as ``build(**params)``.
- It returns a map-style ``torch.utils.data.Dataset`` (``__len__`` and ``__getitem__``; an
  ``IterableDataset`` is refused) whose items are ``(inputs, label)``: ``inputs`` a floating
  tensor, an image ``(C, H, W)`` or a feature vector ``(F,)``, the same shape for every item;
  ``label`` an integer in ``[0, num_classes)``.
- ``num_classes`` is the spec's, else the data set's ``num_classes`` attribute. The model gets
  ``in_channels`` C (or F) and, for images, ``image_size`` W, from the first item.
- ``task: language_model`` (text): items are ``(tokens, targets)``, two integer tensors of
  ``seq_len`` token ids in ``[0, num_classes)`` (``num_classes``: the vocabulary size; targets:
  each position's next token, or -100 where a position counts for nothing). The run counts
  tokens and reports ``eval/perplexity``.

Batches are ``IndexBatchLoader``'s (the image_folder loader's order, striding and exact resume).
Every item is checked as it is read (``workers.data.user_items``); an error names the field, the
item's index, what it was and what is allowed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.data import IterableDataset

from api.data_specs import ImportedDataSpec
from workers.data.index_batches import IndexBatchLoader
from workers.data.position import rank_batch_size
from workers.data.user_items import UserItems, collate_items
from workers.models.code_cache import UserCodeError
from workers.models.user_code import call_user, error_with_tail

# How many of the training set's first items are read before an evaluation set of another shape is
# refused: enough to find a training set whose own items disagree, few enough to fail fast.
TRAIN_ITEMS_CHECKED = 256


def build_user_dataset(spec: ImportedDataSpec, *, field: str) -> Any:
    """``build(**spec.params)`` of the callable ``spec`` imports (``field``: ``data.train`` or
    ``data.eval``); ``UserCodeError`` if it fails or returns no map-style data set."""
    where = f"{field}.import {spec.import_path!r}"
    dataset = call_user(spec, spec.params, field=f"{field}.import")
    if isinstance(dataset, IterableDataset):
        raise UserCodeError(f"{where} returned an IterableDataset ({type(dataset).__name__}); allowed: a map-style "
                            "torch.utils.data.Dataset, with __len__ and __getitem__")
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")) or isinstance(dataset, (str, bytes)):
        raise UserCodeError(f"{where} returned a {type(dataset).__name__}, not a map-style torch.utils.data.Dataset "
                            "(an object with __len__ and __getitem__)")
    try:
        size = len(dataset)
    except Exception as exc:
        raise UserCodeError(f"{where}: len() of the data set failed: {error_with_tail(exc)}") from None
    if size == 0:
        raise UserCodeError(f"{where} returned an empty data set (len 0); it must hold at least one item")
    return dataset


def resolve_num_classes(spec: ImportedDataSpec, dataset: Any, *, field: str, fallback: int | None = None) -> int:
    """The spec's ``num_classes``, else the data set's ``num_classes`` attribute, else ``fallback``
    (the training set's, for evaluation); ``UserCodeError`` naming both ways when none is known."""
    if spec.num_classes is not None:
        return spec.num_classes
    value = getattr(dataset, "num_classes", None)
    if value is None:
        if fallback is not None:
            return fallback
        what = "the vocabulary size" if spec.task == "language_model" else "the number of classes"
        raise UserCodeError(f"{field}.import {spec.import_path!r}: {what} is unknown; set "
                            f"{field}.num_classes in the spec, or give the data set a num_classes attribute "
                            "(an integer >= 1)")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserCodeError(f"{field}.import {spec.import_path!r}: the data set's num_classes attribute is "
                            f"{value!r}; allowed: an integer >= 1 (or set {field}.num_classes in the spec)")
    return value


class UserDataLoader(IndexBatchLoader):
    """Batches of your own data set for this rank, with ``TensorLoader``'s interface.
    ``field``: where the spec is (``data.train``, ``data.eval``), for messages; ``num_classes``:
    the training set's, for evaluation: the fallback when neither the spec nor the data set gives
    one, and the number the data set's must equal;
    ``shape``: the items' shape it must have (evaluation: the training set's); ``check_train``: the
    training loader's ``check_items``, called before this data set is refused for another shape."""

    def __init__(self, spec: ImportedDataSpec, *, field: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 train: bool = True, drop_last: bool = True, seed: int = 0, device: torch.device | str = "cpu",
                 num_classes: int | None = None, shape: tuple[int, ...] | None = None,
                 check_train: Callable[[], int] | None = None):
        rank_batch_size(batch_size, world_size)  # before listing or building anything
        where = f"{field}.import {spec.import_path!r}"
        dataset = build_user_dataset(spec, field=field)
        self.num_classes = resolve_num_classes(spec, dataset, field=field, fallback=num_classes)
        language_model = spec.task == "language_model"
        items = UserItems(dataset, where=where, num_classes=self.num_classes, seed=seed, task=spec.task,
                          shape=(spec.seq_len,) if language_model else None, seq_len_field=f"{field}.seq_len")
        if spec.num_workers > 0:
            items.pickled()  # before any read: a data set that opens its files on first use pickles unopened
        first, _ = items.read(0)
        # Images and feature vectors: evaluation's must be the training data's shape. Token
        # sequences: each data set's own seq_len (a model of positions reads any length it holds).
        if shape is not None and not language_model and tuple(first.shape) != shape:
            _refuse_other_shape(where, tuple(first.shape), shape, check_train)
        items.shape = self.item_shape = tuple(first.shape)
        # An image's channels, a feature vector's length, or (text) seq_len, which models ignore.
        self.in_channels = int(first.shape[0])
        self.image_size = int(first.shape[-1]) if first.dim() == 3 else None
        super().__init__(items, collate=collate_items, batch_size=batch_size, rank=rank, world_size=world_size,
                         train=train, drop_last=drop_last, seed=seed, device=device, num_workers=spec.num_workers)
        if len(self) == 0:
            raise UserCodeError(f"{where}: the data set has {len(items)} items: no full batch of {batch_size} for "
                                f"rank {rank} of {world_size}; lower data.batch_size or add items")
        if num_classes is not None and self.num_classes != num_classes:  # evaluation: the training data's
            outputs = "token of the training vocabulary" if language_model else "training class"
            raise UserCodeError(f"{where} has num_classes {self.num_classes} but the training data has {num_classes}; "
                                f"the model has one output per {outputs}: give {field}.num_classes "
                                f"{num_classes} (or leave it out)")

    def check_items(self, count: int = TRAIN_ITEMS_CHECKED) -> int:
        """Read the first ``count`` items now, each checked as training reads it (the shape of item 0,
        labels in range); returns how many were read. Training reads its items in batches, later: a
        data set whose own items disagree must be named before another is blamed for not matching it."""
        count = min(count, len(self.dataset))
        for index in range(1, count):  # item 0 set the shape
            self.dataset.read(index)
        return count


def _refuse_other_shape(where: str, seen: tuple[int, ...], train_shape: tuple[int, ...],
                        check_train: Callable[[], int] | None) -> None:
    """``UserCodeError``: the evaluation set at ``where`` has items of shape ``seen``, not the training
    set's. The training set's first items are checked first (``check_train``): when they disagree among
    themselves, its own error names the training item, and the evaluation set is not blamed."""
    checked = f" (its first {check_train()} items all do)" if check_train is not None else ""
    raise UserCodeError(f"{where}: its items have shape {seen}, but data.train's have {train_shape}{checked}; "
                        "evaluation data must have the training data's shape")
