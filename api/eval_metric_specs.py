"""Evaluation metrics beyond loss and accuracy: built-in ones by name, or your own code's.

    eval_metrics: [f1_macro, auroc]                                  # built-in, by name
    eval_metrics: [{import: "my_project.metrics:pr_auc", params: {}}]  # yours, shipped with --code

Every evaluation reports ``eval/loss`` and ``eval/accuracy`` (and ``eval/perplexity`` for text);
each metric listed here adds its ``eval/<name>`` keys to those, computed over the whole eval
split (every rank's share) by ``workers.eval_metrics``. Your own callable is called on the
workers, never in the control plane, as ``fn(outputs, targets, **params)``: ``outputs`` the
float32 logits ``(N, C)`` of every eval example, ``targets`` their int64 labels ``(N,)``. It
returns a number (reported as ``eval/<callable's name>``) or a ``{name: number}`` dict
(``eval/<name>`` each).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (ConfigDict, Field, TypeAdapter, ValidationError, ValidatorFunctionWrapHandler,
                      WrapValidator, field_validator, model_validator)

from api.model_specs import ImportPath, _Spec, checked_import_path, refuse_unknown_fields


@dataclass(frozen=True)
class BuiltinMetric:
    description: str
    text: bool  # whether text data may ask for it (next-token metrics); the others need class labels


BUILTIN_EVAL_METRICS: dict[str, BuiltinMetric] = {
    "top5_accuracy": BuiltinMetric("fraction of examples (text: tokens) whose label is among the 5 highest "
                                   "logits (fewer than 5 logits above the label's: a tie counts for it)",
                                   text=True),
    "precision_macro": BuiltinMetric("precision of each class, averaged over the classes seen (as labels or "
                                     "predictions); a class never predicted counts 0", text=False),
    "recall_macro": BuiltinMetric("recall of each class, averaged over the classes seen", text=False),
    "f1_macro": BuiltinMetric("F1 of each class, averaged over the classes seen", text=False),
    "balanced_accuracy": BuiltinMetric("recall of each class, averaged over the classes among the labels",
                                       text=False),
    "auroc": BuiltinMetric("area under the ROC curve of the softmax scores (exact, ties averaged): of class 1 for "
                           "two classes, else one-vs-rest averaged over the classes with both positive and "
                           "negative examples", text=False),
}
MAX_EVAL_METRICS = 16
# What a metric's key may be after ``eval/``: the name of a built-in, or what your callable returns.
METRIC_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
SWEEP_METRIC_PATTERN = r"^eval/[a-z][a-z0-9_]{0,63}$"  # a sweep decides on eval/<name>
RESERVED_METRIC_NAMES = frozenset({"loss", "accuracy", "perplexity"})  # every evaluation reports these itself


def tesseras_own(name: str) -> bool:
    """Whether ``eval/<name>`` is one Tessera reports (always, or as a built-in), not yours."""
    return name in RESERVED_METRIC_NAMES or name in BUILTIN_EVAL_METRICS


class ImportedMetricSpec(ImportPath, _Spec):
    """Your own evaluation metric: ``import: "package.module:callable"``, shipped as a code package."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    import_path: str = Field(..., alias="import", max_length=512,
                             description="'package.module:callable' called as fn(outputs, targets, **params) on the "
                                         "eval split's logits (N, C) and labels (N,); returns a number or "
                                         "{name: number}")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the callable")
    name: str | None = Field(None, exclude_if=lambda name: name is None,
                             description="what a number it returns is reported as (eval/<name>; default: the "
                                         "callable's name, lowercased); a dict's keys are reported as "
                                         "eval/<name>_<key>")

    @model_validator(mode="before")
    @classmethod
    def _only_known_fields(cls, data: Any) -> Any:
        return refuse_unknown_fields(data, ("import", "params", "name"), what="eval metric")

    @field_validator("name")
    @classmethod
    def _a_metric_name(cls, name: str | None) -> str | None:
        problem = None if name is None else metric_name_problem(name)
        if problem:
            raise ValueError(f"name {name!r}: {problem}")
        return name

    @property
    def reported_name(self) -> str:
        """The name a number it returns is reported under: ``name``, else the callable's."""
        return self.name or self.attribute.lower()

    @field_validator("import_path")
    @classmethod
    def _module_colon_callable(cls, path: str) -> str:
        return checked_import_path(path, example="my_project.metrics:pr_auc")


def route_metric(value: Any, handler: Any) -> Any:
    """A listed metric: a built-in's name (a wrong one gets the close names), or with an
    ``import`` key your own. Routing on the form keeps each form's errors its own (a union would
    report both forms' complaints about every input)."""
    if isinstance(value, str):
        if value in RESERVED_METRIC_NAMES:
            raise ValueError(f"eval/{value} is reported at every evaluation already (eval/perplexity for text data); "
                             f"list only others: {', '.join(BUILTIN_EVAL_METRICS)}, or your own")
        if value not in BUILTIN_EVAL_METRICS:
            close = (difflib.get_close_matches(value, BUILTIN_EVAL_METRICS, n=3, cutoff=0.5)
                     or [name for name in BUILTIN_EVAL_METRICS if value and value.lower() in name])
            hint = f"; close names: {', '.join(close)}" if close else ""
            raise ValueError(f"{value!r} is not a built-in evaluation metric{hint}; the built-in ones are "
                             f"{', '.join(BUILTIN_EVAL_METRICS)}, or give your own "
                             "as {import: 'package.module:callable'}")
        return value
    if isinstance(value, dict) and "import" in value or isinstance(value, ImportedMetricSpec):
        return ImportedMetricSpec.model_validate(value)
    raise ValueError(f"a metric is a built-in's name ({', '.join(BUILTIN_EVAL_METRICS)}) or "
                     "{import: 'package.module:callable', params: {...}}, not " + type(value).__name__)


BuiltinMetricName = Literal[tuple(BUILTIN_EVAL_METRICS)]  # type: ignore[valid-type]  # the names above, one list
EvalMetricSpec = Annotated[BuiltinMetricName | ImportedMetricSpec, WrapValidator(route_metric)]
_ONE_METRIC: TypeAdapter[EvalMetricSpec] = TypeAdapter(EvalMetricSpec)


def metric_label(metric: EvalMetricSpec) -> str:
    """How a message names a listed metric: its name, or ``import pkg.mod:fn``."""
    return metric if isinstance(metric, str) else f"import {metric.import_path}"


def every_problem_at_once(value: Any, handler: ValidatorFunctionWrapHandler) -> list[EvalMetricSpec]:
    """The listed metrics. When some are refused, the spec's cross-field rules never run, so the
    list's own rules (``listed_metric_problems``) are checked here, over the metrics that are not:
    one 422 then names a metric listed twice beside an unknown name, not one after the other."""
    try:
        return handler(value)
    except ValidationError as refused:
        errors = refused.errors()
        if not all(error["loc"] and isinstance(error["loc"][0], int) for error in errors):
            raise  # not a list, or too long: there are no metrics to check against each other
        refused_at = {error["loc"][0] for error in errors}
        valid = {index: _ONE_METRIC.validate_python(metric) for index, metric in enumerate(value)
                 if index not in refused_at}
        problems = listed_metric_problems(valid)
        if not problems:
            raise
        # pydantic's errors of the refused metrics as they are, and the list's problems one per line,
        # which the 422 turns into an item each (api.validation_errors) as it does the cross-field rules'.
        list_error = {"type": "value_error", "loc": (), "input": value,
                      "ctx": {"error": ValueError("\n".join(problems))}}
        raise ValidationError.from_exception_data(refused.title, [*errors, list_error])


EvalMetricList = Annotated[list[EvalMetricSpec], WrapValidator(every_problem_at_once)]


def _repeats(metrics: dict[int, EvalMetricSpec]) -> set[int]:
    """The indices of the metrics that repeat an earlier one: the same name, or the same callable
    with the same params and name."""
    seen: set[str] = set()
    repeats: set[int] = set()
    for index, metric in metrics.items():
        key = metric if isinstance(metric, str) else repr((metric.import_path, sorted(metric.params.items()),
                                                           metric.name))
        if key in seen:
            repeats.add(index)
        seen.add(key)
    return repeats


def listed_metric_problems(metrics: dict[int, EvalMetricSpec]) -> list[str]:
    """The list's own rules, over its metrics by their index (a refused one left out), one string
    each starting with the field's path: a metric listed twice is refused, and so is your own whose
    params set what Tessera passes, or that would report under no valid name, under a name of
    Tessera's own, or under the name another of yours reports (each needs a name of its own)."""
    problems: list[str] = []
    repeats = _repeats(metrics)
    names: dict[str, int] = {}  # the name each of your own reports a number under -> its index
    for index, metric in metrics.items():
        at = f"eval_metrics[{index}] {metric_label(metric)!r}"
        if index in repeats:
            problems.append(f"{at} is listed twice; list each metric once")
            continue
        if isinstance(metric, str):
            continue
        passed = sorted({"outputs", "targets"} & set(metric.params))
        if passed:
            problems.append(f"eval_metrics[{index}].params sets {', '.join(passed)}, which Tessera passes itself "
                            "(the eval logits and labels)")
        name = metric.reported_name
        if metric.name is None and not re.match(METRIC_NAME_PATTERN, name):
            problems.append(f"{at} would report a number it returns as eval/{name}, and a name must match "
                            f"{METRIC_NAME_PATTERN}; give it a name: {{import: ..., name: ...}}")
        elif tesseras_own(name):
            problems.append(f"{at} would report a number it returns as eval/{name}, which is Tessera's own; give it "
                            "a name of its own: {import: ..., name: ...}")
        elif name in names:
            problems.append(f"{at} would report a number it returns as eval/{name}, as eval_metrics[{names[name]}] "
                            "would; give each a name of its own: {import: ..., name: ...}")
        names.setdefault(name, index)
    return problems


def eval_metric_problems(metrics: list[EvalMetricSpec], *, text: bool, has_eval: bool,
                         num_classes: int | None) -> list[str]:
    """Rules that need the rest of the spec, then the list's own (``listed_metric_problems``), one
    string each starting with the field's path (``eval_metrics[1] 'auroc' ...``): a listed metric
    needs eval data, the built-ins that read class labels are not for text (a vocabulary-sized
    confusion matrix), nor is your own callable (the logits of every token would be gathered);
    top-5 accuracy needs more than 5 classes (``num_classes``, where the data set's is known here).
    A metric listed twice is judged once, where it is first listed."""
    problems: list[str] = []
    if metrics and not has_eval:
        problems.append("data.eval is not set, but eval_metrics are computed on an eval data set: add one (the "
                        "same data set as train, e.g. its test split) or remove eval_metrics")
    listed = dict(enumerate(metrics))
    repeats = _repeats(listed)
    for index, metric in listed.items():
        at = f"eval_metrics[{index}] {metric_label(metric)!r}"
        if index in repeats:
            continue
        if isinstance(metric, str):
            if text and not BUILTIN_EVAL_METRICS[metric].text:
                allowed = [name for name, info in BUILTIN_EVAL_METRICS.items() if info.text]
                problems.append(f"{at} needs class labels, and text data's are a vocabulary's tokens; for text data "
                                f"the built-in ones allowed are: {', '.join(allowed)} (eval/perplexity is reported "
                                "always)")
            if metric == "top5_accuracy" and not text and num_classes is not None and num_classes <= 5:
                problems.append(f"{at} would always be 1: the data has {num_classes} classes, so the top 5 logits "
                                "hold every label; list it for data of more than 5 classes")
        elif text:
            problems.append(f"{at}: your own metrics take classification data's logits (N, C); text data's "
                            "(every token's vocabulary-sized logits) are not gathered for them")
    return problems + listed_metric_problems(listed)


def reported_metric_names(metrics: list[EvalMetricSpec]) -> tuple[set[str], bool]:
    """The ``eval/`` names the listed built-ins report, and whether any metric is your own
    (whose names are known only when it returns)."""
    return {m for m in metrics if isinstance(m, str)}, any(not isinstance(m, str) for m in metrics)


def metric_name_problem(name: Any) -> str | None:
    """Why your metric may not be reported as ``eval/<name>``, or None when it may."""
    if not isinstance(name, str) or not re.match(METRIC_NAME_PATTERN, name):
        return (f"a name must match {METRIC_NAME_PATTERN} (lowercase letters, digits, underscores; it is reported as "
                "eval/<name>)")
    if tesseras_own(name):
        return f"eval/{name} is Tessera's own; name yours differently"
    return None
