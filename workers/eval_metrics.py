"""The spec's ``eval_metrics`` (``api.eval_metric_specs``) over one evaluation, across ranks.

Each rank feeds every eval batch it counts to ``update``; ``compute`` then makes the
collectives once and returns ``{"eval/<name>": value}``. What a metric needs decides how it
crosses ranks:

- ``top5_accuracy`` and the confusion-matrix metrics (precision, recall, F1, balanced accuracy)
  are sums: one all-reduce of a ``[top-5 hits, counted, confusion matrix...]`` vector;
- ``auroc`` and your own callables need every example's logits: each rank's are gathered to
  every rank (``all_gather_object``), which then computes the same values from the same data,
  so that a callable that raises raises on every rank alike, and no rank waits on another.

Your callable is loaded when the trainer is built, so an import path that fails fails the run
before its first step, not at its first evaluation.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from typing import Any, Callable

import torch
import torch.distributed as dist

from algorithms.targets import IGNORE_INDEX
from api.eval_metric_specs import EvalMetricSpec, metric_name_problem
from workers.models.code_cache import UserCodeError
from workers.parallel import all_reduce_sum

log = logging.getLogger(__name__)

CONFUSION_METRICS = ("precision_macro", "recall_macro", "f1_macro", "balanced_accuracy")


class EvalMetrics:
    """The listed metrics of one run (``specs``), for a model of ``num_classes`` outputs."""

    def __init__(self, specs: list[EvalMetricSpec], *, num_classes: int, device: torch.device) -> None:
        from workers.models.user_code import load_callable  # importlib's machinery: only runs that list one

        self.builtins = [m for m in specs if isinstance(m, str)]
        self.own: list[tuple[str, Any, Callable[..., Any]]] = [
            (f"eval_metrics[{i}].import", m, _callable_as_metric(f"eval_metrics[{i}].import", m, load_callable))
            for i, m in enumerate(specs) if not isinstance(m, str)]
        self.num_classes, self.device = num_classes, device
        self.top5 = "top5_accuracy" in self.builtins
        self.confusion = any(name in CONFUSION_METRICS for name in self.builtins)
        self.gathers = bool(self.own) or "auroc" in self.builtins
        if self.top5 and num_classes <= 5:  # your own data's count, known only here (a named set's is refused at submit)
            log.warning("eval_metrics: top5_accuracy will always be 1: the data has %d classes, so the top 5 logits "
                        "hold every label", num_classes)
        self.start()

    def __bool__(self) -> bool:
        return bool(self.builtins or self.own)

    def start(self) -> None:
        """Forget the last evaluation's batches."""
        size = 2 + (self.num_classes ** 2 if self.confusion else 0)  # top-5 hits, counted, confusion matrix
        self.sums = torch.zeros(size, dtype=torch.float64, device=self.device)
        self.outputs: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One eval batch's logits ``(N, C)`` (text: ``(B, T, V)``, every kept token an example)
        and index targets."""
        logits = outputs.detach().float()
        logits = logits.reshape(-1, logits.shape[-1])
        targets = targets.reshape(-1)
        kept = targets != IGNORE_INDEX
        if not bool(kept.all()):
            logits, targets = logits[kept], targets[kept]
        self.sums[1] += targets.numel()
        if self.top5:
            # A hit: fewer than 5 logits above the label's (a tie counts for the label: well defined,
            # where topk would pick among tied classes arbitrarily).
            label_logit = logits.gather(1, targets.long()[:, None])
            self.sums[0] += ((logits > label_logit).sum(dim=-1) < 5).sum()
        if self.confusion:
            if logits.shape[-1] != self.num_classes:
                raise UserCodeError(f"eval_metrics: the model returned logits of {logits.shape[-1]} classes for data "
                                    f"of {self.num_classes}; the confusion-matrix metrics "
                                    f"({', '.join(n for n in self.builtins if n in CONFUSION_METRICS)}) need one "
                                    "logit per class")
            cells = targets.long() * self.num_classes + logits.argmax(dim=-1)
            self.sums[2:] += torch.bincount(cells, minlength=self.num_classes ** 2).double()
        if self.gathers:
            self.outputs.append(logits.cpu())
            self.targets.append(targets.long().cpu())

    def compute(self) -> dict[str, float]:
        """Every listed metric over every rank's batches since ``start``; collectives in the
        same order on every rank."""
        sums = all_reduce_sum(self.sums).cpu()
        results: dict[str, float] = {}
        counted = float(sums[1])
        if self.top5:
            results["eval/top5_accuracy"] = float(sums[0]) / counted if counted else math.nan
        if self.confusion:
            results.update(confusion_metrics(sums[2:].reshape(self.num_classes, self.num_classes),
                                             [n for n in self.builtins if n in CONFUSION_METRICS]))
        if self.gathers:
            outputs, targets = _gathered(self.outputs, self.targets, self.num_classes)
            if "auroc" in self.builtins:
                results["eval/auroc"] = auroc(outputs, targets)
            for field, spec, function in self.own:
                results.update(_call_own(field, spec, function, outputs, targets, taken=results))
        self.start()
        return results


def _gathered(outputs: list[torch.Tensor], targets: list[torch.Tensor],
              num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's eval logits and labels, in rank order, on every rank."""
    mine = (torch.cat(outputs) if outputs else torch.empty(0, num_classes),
            torch.cat(targets) if targets else torch.empty(0, dtype=torch.long))
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return mine
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return torch.cat([o for o, _ in every]), torch.cat([t for _, t in every])


def confusion_metrics(matrix: torch.Tensor, names: list[str]) -> dict[str, float]:
    """Macro averages from a confusion matrix (rows: labels, columns: predictions), as
    scikit-learn computes them: precision, recall and F1 averaged over the classes that occur as
    a label or a prediction (a class never predicted has precision 0), balanced accuracy over
    the classes that occur as a label."""
    matrix = matrix.double()
    hits, labelled, predicted = matrix.diagonal(), matrix.sum(dim=1), matrix.sum(dim=0)
    seen = (labelled + predicted) > 0
    precision = torch.where(predicted > 0, hits / predicted.clamp_min(1), 0.0)
    recall = torch.where(labelled > 0, hits / labelled.clamp_min(1), 0.0)
    f1 = torch.where(seen, 2 * hits / (labelled + predicted).clamp_min(1), 0.0)
    values = {"precision_macro": precision[seen], "recall_macro": recall[seen], "f1_macro": f1[seen],
              "balanced_accuracy": recall[labelled > 0]}
    return {f"eval/{name}": float(values[name].mean()) if values[name].numel() else math.nan for name in names}


def auroc(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Area under the ROC curve of the softmax scores: class 1's for two classes, else the mean
    over classes of one-vs-rest, counting only classes with both positive and negative examples;
    NaN when there is none."""
    scores = torch.softmax(logits.double(), dim=-1)
    if scores.shape[-1] == 2:
        return binary_auroc(scores[:, 1], targets == 1)
    areas = [binary_auroc(scores[:, c], targets == c) for c in range(scores.shape[-1])]
    areas = [a for a in areas if not math.isnan(a)]
    return sum(areas) / len(areas) if areas else math.nan


def binary_auroc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """The Mann-Whitney statistic: the chance that a random positive scores above a random
    negative, a tie counting one half (tied scores share their average rank). Exact."""
    positives = int(positive.sum())
    negatives = positive.numel() - positives
    if positives == 0 or negatives == 0:
        return math.nan
    order = scores.argsort()
    _, group, sizes = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    ends = sizes.cumsum(0).double()
    average_rank = ends - (sizes.double() - 1) / 2  # 1-based ranks of a tied group, averaged
    ranks = torch.empty_like(scores, dtype=torch.float64)
    ranks[order] = average_rank[group]
    return float((ranks[positive].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _callable_as_metric(field: str, spec: Any, load: Callable[..., Callable[..., Any]]) -> Callable[..., Any]:
    """Your callable, loaded (``load``: ``user_code.load_callable``), once its signature is seen
    to take ``(outputs, targets, **params)``: a callable of another shape, or a misspelled param,
    fails the run before its first step instead of at its first evaluation."""
    function = load(spec, field=field)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or extension function without one: the call will tell
        return function
    try:
        signature.bind(None, None, **spec.params)
    except TypeError as exc:
        params = ", ".join(f"{k}={v!r}" for k, v in spec.params.items())
        raise UserCodeError(f"{field} {spec.import_path!r}: a metric is called as fn(outputs, targets"
                            f"{', ' + params if params else ''}), which {spec.attribute}{signature} does not take: "
                            f"{exc}") from None
    return function


def _call_own(field: str, spec: Any, function: Callable[..., Any], outputs: torch.Tensor, targets: torch.Tensor,
              *, taken: dict[str, float]) -> dict[str, float]:
    """``{"eval/<name>": value}`` of your callable's result: a number named after the callable,
    or a ``{name: number}`` dict. ``UserCodeError`` naming ``field`` when it raises or returns
    something else."""
    from workers.models.user_code import error_with_tail

    source = f"{field} {spec.import_path!r}"
    try:
        returned = function(outputs, targets, **spec.params)
    except Exception as exc:
        raise UserCodeError(f"{source}: calling it with the eval logits {tuple(outputs.shape)} and labels "
                            f"{tuple(targets.shape)} failed: {error_with_tail(exc)}") from None
    if isinstance(returned, dict):  # named by its keys, after the spec's name when it gives one
        named = {(f"{spec.name}_{k}" if spec.name and isinstance(k, str) else k): v for k, v in returned.items()}
    else:
        named = {spec.reported_name: returned}
    results = {}
    for name, value in named.items():
        problem = metric_name_problem(name)
        if problem:
            raise UserCodeError(f"{source} returned a metric named {name!r}; {problem}")
        key = f"eval/{name}"
        number = _number(value)
        if number is None:
            raise UserCodeError(f"{source} returned {value!r} for {key}; a metric is a number (a float, an int, or "
                                "a tensor or NumPy value of one element)")
        if key in taken or key in results:
            raise UserCodeError(f"{source} returned {key}, which another listed metric reports too; name it "
                                "differently")
        results[key] = number
    return results


def _number(value: Any) -> float | None:
    """``value`` as a float: a real number, or a one-element tensor or NumPy array; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    one = value.numel() == 1 if isinstance(value, torch.Tensor) else getattr(value, "size", None) == 1  # NumPy
    if one and hasattr(value, "item"):
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) and not isinstance(item, bool) else None
    return None
