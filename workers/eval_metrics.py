"""The spec's ``eval_metrics`` (``api.eval_metric_specs``) over one evaluation, across ranks.

Each rank feeds every eval batch it counts to ``update``; ``compute`` then makes the
collectives once and returns ``{"eval/<name>": value}``. What a metric needs decides how it
crosses ranks:

- ``top5_accuracy`` and the confusion metrics (precision, recall, F1, balanced accuracy) are
  sums: one all-reduce of a ``[top-5 hits, counted, per-class hits, labels, predictions]``
  vector (3 x classes: what a confusion matrix's diagonal and margins hold, all these need);
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
CLASS_COUNTS = 4  # where the per-class counts start in ``EvalMetrics.sums``


class EvalMetrics:
    """The listed metrics of one run (``specs``), for a model of ``num_classes`` outputs.

    ``sums`` (float64, on the device; nothing leaves it until ``compute``): ``[top-5 hits,
    examples counted, batches whose logits were not num_classes wide, of those the ones with
    fewer, then per class: hits, labels, predictions]``, the last three for the confusion metrics
    only."""

    def __init__(self, specs: list[EvalMetricSpec], *, num_classes: int, device: torch.device) -> None:
        from workers.models.user_code import load_callable  # importlib's machinery: only runs that list one

        self.builtins = [m for m in specs if isinstance(m, str)]
        self.own: list[tuple[str, Any, Callable[..., Any]]] = [
            (f"eval_metrics[{i}].import", m, _callable_as_metric(f"eval_metrics[{i}].import", m, load_callable))
            for i, m in enumerate(specs) if not isinstance(m, str)]
        self.num_classes, self.device = num_classes, device
        self.top5 = "top5_accuracy" in self.builtins
        self.confusion = [name for name in self.builtins if name in CONFUSION_METRICS]
        self.gathers = bool(self.own) or "auroc" in self.builtins
        if self.top5 and num_classes <= 5:  # your own data's count, known only here (a named set's: refused at submit)
            log.warning("eval_metrics: top5_accuracy will always be 1: the data has %d classes, so the top 5 logits "
                        "hold every label", num_classes)
        self.start()

    def __bool__(self) -> bool:
        return bool(self.builtins or self.own)

    def start(self) -> None:
        """Forget the last evaluation's batches."""
        size = CLASS_COUNTS + (3 * self.num_classes if self.confusion else 0)
        self.sums = torch.zeros(size, dtype=torch.float64, device=self.device)
        self.outputs: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        """One eval batch's logits ``(N, C)`` (text: ``(B, T, V)``, every kept token an example)
        and index targets. Nothing here waits for the device or copies the logits whole (text's
        are vocabulary-sized per token); a wrong width is counted, and ``compute`` raises it on
        every rank at once (raised here, a rank with no eval batch would wait in the collective)."""
        outputs = outputs.detach()
        kept = targets != IGNORE_INDEX
        labels = targets.long().clamp_min(0)  # an ignored position reads class 0, and counts for nothing
        self.sums[1] += kept.sum()
        # Fewer logits than classes (a label past them would fail the gather below on this rank
        # alone), or, for the metrics that read one logit per class, any other number of them.
        # (Text logits may cover a padded vocabulary: wider is fine for top-5.)
        narrower = outputs.shape[-1] < self.num_classes
        if narrower or (outputs.shape[-1] != self.num_classes and (self.confusion or self.gathers)):
            self.sums[2] += 1
            self.sums[3] += narrower
            return
        if self.top5:
            # A hit: fewer than 5 logits above the label's (a tie counts for the label: well defined,
            # where topk would pick among tied classes arbitrarily). In the logits' own dtype.
            label_logit = outputs.gather(-1, labels.unsqueeze(-1))
            self.sums[0] += (((outputs > label_logit).sum(dim=-1) < 5) & kept).sum()
        if self.confusion:
            # Integer counts, an ignored position in an extra bin that is dropped: bincount with
            # weights has no deterministic CUDA kernel (deterministic: true would refuse it).
            classes, first = self.num_classes, CLASS_COUNTS
            kept, labels, predictions = kept.reshape(-1), labels.reshape(-1), outputs.argmax(dim=-1).reshape(-1)
            spare = torch.full_like(labels, classes)
            for offset, counted in ((first, torch.where(kept & (predictions == labels), labels, spare)),
                                    (first + classes, torch.where(kept, labels, spare)),
                                    (first + 2 * classes, torch.where(kept, predictions, spare))):
                self.sums[offset:offset + classes] += torch.bincount(counted, minlength=classes + 1)[:classes]
        if self.gathers:  # classification only (refused at submit for text): no ignored positions to drop
            self.outputs.append(outputs.float())
            self.targets.append(labels)

    def compute(self) -> dict[str, float]:
        """Every listed metric over every rank's batches since ``start``; collectives in the
        same order on every rank (the sums, then the gather), and every rank raises alike."""
        sums = all_reduce_sum(self.sums).cpu()
        outputs_kept, targets_kept = self.outputs, self.targets
        self.start()
        if sums[2]:
            # top-5 takes wider logits (a padded vocabulary): it is named only if some were narrower
            names = ", ".join([n for n in self.builtins if n != "top5_accuracy" or sums[3]]
                              + [spec.import_path for _, spec, _ in self.own])
            raise UserCodeError(f"eval_metrics: the model returned logits of another width than the data's "
                                f"{self.num_classes} classes in {int(sums[2])} eval batch(es); these need one "
                                f"logit per class: {names}")
        results: dict[str, float] = {}
        counted = float(sums[1])
        if self.top5:
            results["eval/top5_accuracy"] = float(sums[0]) / counted if counted else math.nan
        if self.confusion:
            classes, first = self.num_classes, CLASS_COUNTS
            results.update(confusion_metrics(sums[first:first + classes], sums[first + classes:first + 2 * classes],
                                             sums[first + 2 * classes:], self.confusion))
        if self.gathers:
            outputs, targets = _gathered(outputs_kept, targets_kept, self.num_classes)
            if "auroc" in self.builtins:
                results["eval/auroc"] = auroc(outputs, targets)
            for field, spec, function in self.own:  # each its own copy: one may change what it is given
                results.update(_call_own(field, spec, function, outputs.clone(), targets.clone(), taken=results))
        return results


def _gathered(outputs: list[torch.Tensor], targets: list[torch.Tensor],
              num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's eval logits and labels, in rank order, on every rank (on the CPU)."""
    mine = (torch.cat(outputs).cpu() if outputs else torch.empty(0, num_classes),
            torch.cat(targets).cpu() if targets else torch.empty(0, dtype=torch.long))
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return mine
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return torch.cat([o for o, _ in every]), torch.cat([t for _, t in every])


def confusion_metrics(hits: torch.Tensor, labelled: torch.Tensor, predicted: torch.Tensor,
                      names: list[str]) -> dict[str, float]:
    """Macro averages from per-class counts (correct predictions, labels, predictions), as
    scikit-learn computes them: precision, recall and F1 averaged over the classes that occur as
    a label or a prediction (a class never predicted has precision 0), balanced accuracy over
    the classes that occur as a label."""
    hits, labelled, predicted = hits.double(), labelled.double(), predicted.double()
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
