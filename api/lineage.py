"""Fork and continue: the request bodies, how a fork's patch merges into its parent's spec, and
which changes a parent's checkpoint survives.

Pure functions over JSON specs (no service, no torch), so the service refuses an unloadable
fork at submit and the SDK or CLI can preview the merged spec.

The merge is JSON Merge Patch (RFC 7386) with two rules added for tagged objects: objects merge
key by key, ``null`` deletes a key, lists and scalars replace, except that a list of tagged
objects (``algorithms``, ``loggers``) may be patched by an object keyed by their names, which
changes, removes (``null``) or appends those items and keeps the rest
(``algorithms: {label_smoothing: {smoothing: 0.2}}``, what ``--set
algorithms.label_smoothing.smoothing=0.2`` makes, as a sweep's ``search.params`` names them);
an object whose ``name`` changes
(``optimizer: {name: adamw, lr: 1e-3}`` over an SGD optimizer) replaces the parent's object
instead of merging into it, since the other kind's fields would not validate (a field the new
object needs is then named with the reason: ``replaced_objects``). The spec's own ``name``
changes only the run's name.

Which changes a checkpoint survives (``unloadable_changes``), for a fork that starts from one:

- ``model`` must be equal (name, params, or the imported callable and its params): anything
  else is another set of tensors.
- The surgery algorithms (``changes_model`` in ``api.catalog``) must be the same list with the
  same settings: surgery replaces modules before the checkpoint is loaded, so adding, removing
  or re-parameterizing one changes the module tree. Settings are compared with their defaults
  filled in (a parent stored before a field existed compares as its default), less the fields
  that only say how new tensors start (factorize's ``init``: the checkpoint overwrites them).
  Other algorithms may come and go.
- The train data set must be the same kind with the same number of classes, channels and image
  size (the classifier head and the stem have those shapes); its root, size and noise may change.
- The optimizer may change: with the same ``optimizer.name`` its state (momentum, Adam moments)
  is loaded and the fork's hyperparameters (lr, weight decay, ...) replace the parent's; with
  another name only the model (and the state of algorithms both runs have) is loaded.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.algorithm_specs import surgery_identity
from api.catalog import ALGORITHMS
from api.time import DurationTime, Time

FORK_SOURCES = ("latest", "scratch")
# Fields of the train data set that give the model's input and output layers their shapes
# (your own data set's task: classes or a vocabulary; a seq_len is not one: no tensor depends on it).
SHAPE_DATA_FIELDS = ("name", "num_classes", "channels", "image_size", "task")


class ForkStep(BaseModel):
    """Start from the parent's committed checkpoint at this batch."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(..., ge=0, le=2**62, description="the batch of one of the parent's committed checkpoints")


class ForkRequest(BaseModel):
    """``POST /runs/{id}/fork``: a partial ``RunSpec`` merged into the parent's, and where the
    weights come from: ``latest`` (the parent's newest committed checkpoint), ``scratch`` (fresh
    weights: only the spec is copied) or ``{"step": N}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)
    patch: dict[str, Any] = Field(default_factory=dict, description="a partial RunSpec (JSON Merge Patch)")
    from_: Literal["latest", "scratch"] | ForkStep = Field("latest", alias="from")


class ForkInfo(BaseModel):
    """What a forked run came from (``RunView.fork``): the choice, the patch, and the parent's
    checkpoint the service resolved it to (none for ``scratch``). ``load_optimizer``: whether the
    optimizer state is loaded too (the optimizer's name is unchanged)."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)
    from_: Literal["latest", "scratch"] | ForkStep = Field(..., alias="from")
    patch: dict[str, Any] = Field(default_factory=dict)
    checkpoint_url: str | None = None
    step: int | None = Field(None, description="the batch of the checkpoint loaded")
    load_optimizer: bool = False


class ContinueRequest(BaseModel):
    """``POST /runs/{id}/continue``: train a COMPLETED run on to a longer ``max_duration`` (same
    unit) as its next attempt."""

    model_config = ConfigDict(extra="forbid")
    max_duration: DurationTime = Field(..., description="e.g. '20ep': longer than the run's, in the same unit")


def merge_patch(base: Any, patch: Any) -> Any:
    """``patch`` merged into ``base`` (see the module docstring); neither is changed. The spec's
    own ``name`` (the run's) is a field like any other: only a nested object is replaced when its
    ``name`` changes."""
    return _merged(base, patch, nested=False)


NAMED_LISTS = ("algorithms", "loggers")  # lists of tagged objects a patch may address by name


def _merged(base: Any, patch: Any, *, nested: bool, key: str | None = None) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if key in NAMED_LISTS and _is_named_list(base):
        return _merged_by_name(key, base, patch)
    if not isinstance(base, dict) or (nested and _renamed(base, patch)):
        base = {}
    merged = copy.deepcopy(base)
    for field, value in patch.items():
        if value is None:
            merged.pop(field, None)
        else:  # the spec's own lists of tagged objects may be patched by name
            merged[field] = _merged(merged.get(field), value, nested=True, key=None if nested else field)
    return merged


def _is_named_list(value: Any) -> bool:
    """A list of tagged objects (``algorithms``, ``loggers``): each a dict with a ``name``."""
    return isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value)


class PatchError(ValueError):
    """A patch that cannot be merged: ``field`` (under ``patch``), the bad ``value``, what is allowed."""

    def __init__(self, field: str, msg: str, value: Any):
        self.field, self.msg, self.value = field, msg, value
        super().__init__(f"{field}: {msg}")


_POSITION = re.compile(r"[0-9]+")


def _merged_by_name(key: str, base: list[dict[str, Any]], patch: dict[str, Any]) -> list[Any]:
    """The list ``key`` of tagged objects patched by an object keyed by their names (``--set
    algorithms.label_smoothing.smoothing=0.2``) or positions in the parent's list
    (``algorithms.0.smoothing``, as ``tessera diff`` prints them): an item merges its patch, or is
    replaced whole when the patch renames it; ``null`` removes it; a name the list lacks is
    appended (``{cutmix: {alpha: 1.0}}``). The order is kept. ``PatchError`` for a position past
    the end of the list."""
    items: list[Any] = [copy.deepcopy(item) for item in base]  # None: removed
    appended: list[Any] = []
    for name, value in patch.items():
        if _POSITION.fullmatch(str(name)):
            at: int | None = int(name)
            if at >= len(base):
                raise PatchError(f"{key}.{name}", f"the spec's {key} has {len(base)} item(s), positions 0 to "
                                 f"{len(base) - 1}; name a method instead (e.g. {key}.<name>.<field>)", value)
        else:
            at = next((i for i, item in enumerate(items) if isinstance(item, dict) and item.get("name") == name), None)
        if at is None:
            if value is not None:
                appended.append(_merged({"name": name}, value, nested=False))
        elif value is None:
            items[at] = None
        elif isinstance(value, dict) and "name" in value and value["name"] != (items[at] or {}).get("name"):
            items[at] = copy.deepcopy(value)  # renamed: another method, with only the fields given
        else:
            items[at] = _merged(items[at], value, nested=False)
    return [item for item in items if item is not None] + appended


def _renamed(base: dict[str, Any], patch: dict[str, Any]) -> bool:
    return "name" in patch and patch["name"] != base.get("name")


def replaced_objects(base: Any, patch: Any, path: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """``(field, old name, new name)`` for each object of ``base`` that ``merge_patch`` replaced
    instead of merging into, because the patch changed its ``name``: its other fields are gone
    and the patch must give them (``optimizer: {name: adamw}`` over SGD needs ``lr`` again)."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return []
    if path and "name" in base and _renamed(base, patch):
        return [(".".join(path), base["name"], patch["name"])]
    found = []
    for key, value in patch.items():
        if value is not None:
            found.extend(replaced_objects(base.get(key), value, (*path, str(key))))
    return found


def replaced_object_hint(field: str, replaced: list[tuple[str, Any, Any]]) -> str | None:
    """What to add to a "Field required" error at ``field`` that lies in a replaced object, or None."""
    for path, old, new in replaced:
        if field.startswith(f"{path}.") or field.startswith(f"{path}["):
            return (f"{path} was replaced because its name changed ({old} to {new}): give its other fields too, "
                    f"e.g. {field}")
    return None


def _surgery(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The spec's surgery algorithms (``changes_model``) in order, each with the settings its
    tensors' shapes depend on (``surgery_identity``: defaults filled in, ``init`` left out)."""
    return [surgery_identity(a) for a in spec.get("algorithms", []) if ALGORITHMS.get(a.get("name")) is not None
            and ALGORITHMS[a["name"]].changes_model]


def _shape_fields(spec: dict[str, Any]) -> dict[str, Any]:
    train = spec["data"]["train"]
    return {key: train.get(key) for key in SHAPE_DATA_FIELDS if key in train}


def unloadable_changes(parent: dict[str, Any], child: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, why)`` for each change of ``child`` (a validated spec, as JSON) from ``parent``
    that makes the parent's checkpoint unloadable; empty if it loads."""
    problems = []
    if child["model"] != parent["model"]:
        problems.append(("model", f"the model changed from {parent['model']} to {child['model']}; a checkpoint "
                                  "holds one model's tensors (fork from 'scratch' to train the new model)"))
    if _surgery(child) != _surgery(parent):
        had, has = ([a["name"] for a in _surgery(spec)] for spec in (parent, child))
        problems.append(("algorithms", f"the surgery algorithms changed from {had} to {has} "
                                       "(or their settings did); surgery changes the model's modules before the "
                                       "checkpoint is loaded, so keep them as they were or fork from 'scratch'"))
    before, after = _shape_fields(parent), _shape_fields(child)
    if before != after:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        problems.append(("data.train", f"data.train {', '.join(changed)} changed ({before} to {after}); they give "
                                       "the model's input and output layers their shapes"))
    return problems


def loads_optimizer(parent: dict[str, Any], child: dict[str, Any]) -> bool:
    """The optimizer state carries over when the optimizer is the same kind."""
    return parent["optimizer"]["name"] == child["optimizer"]["name"]


def longer_duration_problem(current: str, requested: Time) -> str | None:
    """Why ``requested`` cannot continue a run that trained for ``current``, or None."""
    now = Time.parse(current)
    if requested.unit is not now.unit:
        return (f"max_duration {requested} is in {requested.unit.value} but the run's is {current}; "
                f"give it in {now.unit.value} (units cannot be mixed)")
    if requested.value <= now.value:
        return f"max_duration {requested} is not longer than the run's {current}; give a longer one"
    return None
