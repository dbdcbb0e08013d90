"""SweepSpec: a search over combinations of speedup methods and their hyperparameters.

A sweep is a base ``RunSpec`` plus a search space. The algorithm part of the space is a list
of algorithm *sets* (given explicitly, or every subset of a pool up to ``max_size``); sets
that break a compatibility rule are skipped and listed, not run. The param part maps dotted
paths in the RunSpec (``optimizer.lr``, ``algorithms.cutmix.alpha``) to Tune-style domains.
Everything here is validated before anything is stored.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from api.algorithm_specs import ALGORITHM_SPECS
from api.data_specs import dataset_domain, dataset_label
from api.eval_metric_specs import BUILTIN_EVAL_METRICS, SWEEP_METRIC_PATTERN, reported_metric_names, tesseras_own
from api.specs import NAME_PATTERN, RunSpec
from api.time import IntervalTime, Time, TimeUnit
from api.validation_errors import field_path, join_field, one_line
from api.views import metric_mode


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParamDomain(_Spec):
    """Exactly one of: ``grid`` (every value, crossed with the rest), ``choice`` (sampled),
    ``uniform: [low, high]`` or ``loguniform: [low, high]`` (sampled, low > 0)."""

    grid: list[Any] | None = Field(None, min_length=1)
    choice: list[Any] | None = Field(None, min_length=1)
    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "ParamDomain":
        given = [k for k in ("grid", "choice", "uniform", "loguniform") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of grid, choice, uniform, loguniform (got {given or 'none'})")
        for kind in ("uniform", "loguniform"):
            bounds = getattr(self, kind)
            if bounds is not None:
                low, high = bounds
                if not (math.isfinite(low) and math.isfinite(high)):
                    raise ValueError(f"{kind} bounds [{low}, {high}] must be finite numbers")
                if not low < high:
                    raise ValueError(f"{kind} bounds [{low}, {high}] must satisfy low < high")
                if kind == "loguniform" and low <= 0:
                    raise ValueError(f"loguniform bounds [{low}, {high}] must be positive")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("grid", "choice", "uniform", "loguniform") if getattr(self, k) is not None)

    def extremes(self) -> list[Any]:
        """Values that bound the domain: every listed value, or both ends of a range."""
        return list(getattr(self, self.kind))

    def examples(self) -> list[Any]:
        """Values a trial may get, to check against the spec: every listed value, or a range's
        ends and a value drawn from inside it (not a whole number: a range over an integer field
        draws fractions, which the field refuses)."""
        if self.kind in ("grid", "choice"):
            return self.extremes()
        low, high = getattr(self, self.kind)
        inside = math.sqrt(low * high) if self.kind == "loguniform" else (low + high) / 2
        return [low, high, inside if not inside.is_integer() else inside + (high - inside) / 3]


class AlgorithmSearch(_Spec):
    """``pool`` + ``max_size`` (every subset of the pool with at most max_size methods, the
    empty baseline included) or ``sets`` (an explicit list of method lists)."""

    pool: list[str] | None = None
    max_size: int | None = Field(None, ge=0, le=8)
    sets: list[list[str]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_form(self) -> "AlgorithmSearch":
        if (self.pool is None) == (self.sets is None):
            raise ValueError("give either pool (with max_size) or sets, not both or neither")
        known = sorted(ALGORITHM_SPECS)
        names = self.pool if self.pool is not None else [n for s in self.sets for n in s]
        unknown = sorted({n for n in names if n not in ALGORITHM_SPECS})
        if unknown:
            raise ValueError(f"unknown algorithm(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        if self.pool is not None and len(set(self.pool)) != len(self.pool):
            twice = sorted({n for n in self.pool if self.pool.count(n) > 1})
            raise ValueError(f"pool lists {', '.join(map(repr, twice))} twice; list each method once")
        for index, methods in enumerate(self.sets or []):
            if len(set(methods)) != len(methods):
                twice = sorted({n for n in methods if methods.count(n) > 1})
                raise ValueError(f"sets[{index}] {methods} lists {', '.join(map(repr, twice))} twice; list each "
                                 "method once")
        return self

    def candidate_sets(self) -> list[tuple[str, ...]]:
        if self.sets is not None:
            return [tuple(s) for s in self.sets]
        max_size = len(self.pool) if self.max_size is None else min(self.max_size, len(self.pool))
        return [combo for size in range(max_size + 1) for combo in itertools.combinations(self.pool, size)]


class SearchSpec(_Spec):
    algorithms: AlgorithmSearch | None = None
    params: dict[str, ParamDomain] = Field(default_factory=dict)


class SweepSchedulerSpec(_Spec):
    name: Literal["fifo", "asha"] = "fifo"
    grace_period: IntervalTime = Field(default_factory=lambda: Time(1, TimeUnit.EPOCH),
                                       description="ASHA: no trial is stopped before this much training")
    reduction_factor: float = Field(3.0, ge=2.0, le=10.0)


# The contract's ceiling on trials per sweep; a service may set a lower one (TESSERA_MAX_SWEEP_TRIALS).
# Checked arithmetically before any set or grid value is expanded or validated, so a huge grid
# costs a multiplication, never a stall.
MAX_SWEEP_TRIALS = 10_000


def trial_count(search: SearchSpec, num_samples: int) -> int:
    """How many trials the search expands to: candidate algorithm sets × every grid's size ×
    ``num_samples``, computed without expanding anything (sets that break a rule are skipped
    later, so this is an upper bound)."""
    count = num_samples
    if search.algorithms is not None:
        algorithms = search.algorithms
        if algorithms.sets is not None:
            count *= len(algorithms.sets)
        else:
            size = len(algorithms.pool)
            max_size = size if algorithms.max_size is None else min(algorithms.max_size, size)
            count *= sum(math.comb(size, k) for k in range(max_size + 1))
    for domain in search.params.values():
        if domain.grid is not None:
            count *= len(domain.grid)
    return count


def trial_count_problem(search: SearchSpec, num_samples: int, cap: int) -> str | None:
    """The refusal when the search expands to more than ``cap`` trials, else None."""
    count = trial_count(search, num_samples)
    if count > cap:
        return (f"search: expands to {count} trials; at most {cap} allowed (algorithm sets × grid "
                f"points × num_samples); shrink the grids or sample with choice/uniform instead")
    return None


class SweepSpec(_Spec):
    name: str = Field(..., min_length=1, max_length=128, pattern=NAME_PATTERN)
    base: RunSpec
    search: SearchSpec
    metric: str = Field(
        "eval/accuracy", max_length=70,
        description="what the scheduler decides on: an evaluation metric (reported after each eval): eval/accuracy, "
                    "eval/loss, eval/perplexity (text), or one of the base's eval_metrics (eval/f1_macro, or a name "
                    "your own metric returns)")
    mode: Literal["max", "min"] = Field("max", description="whether a higher or lower metric is better; left out, "
                                                            "the metric's own direction (max for eval/accuracy, min "
                                                            "for eval/loss and eval/perplexity)")
    num_samples: int = Field(1, ge=1, le=1000, description="repeats per grid point / draws for random search")
    scheduler: SweepSchedulerSpec = Field(default_factory=SweepSchedulerSpec)
    max_concurrent_trials: int = Field(2, ge=1, le=256)
    time_budget_s: float | None = Field(None, gt=0)

    @field_validator("metric")
    @classmethod
    def _an_evaluation_metric(cls, metric: str) -> str:
        if not re.match(SWEEP_METRIC_PATTERN, metric):
            raise ValueError(f"{metric!r} is no evaluation metric the scheduler sees: eval/ then a metric's name "
                             "(lowercase letters, digits, underscores): eval/accuracy, eval/loss, eval/perplexity "
                             "(text), or one of base.eval_metrics such as eval/f1_macro")
        return metric

    @model_validator(mode="after")
    def _mode_of_the_metric(self) -> "SweepSpec":
        if "mode" not in self.model_fields_set:  # stored sweeps name their mode: they keep it
            self.mode = metric_mode(self.metric)
        return self

    @model_validator(mode="after")
    def _search_fits_the_base(self) -> "SweepSpec":
        too_many = trial_count_problem(self.search, self.num_samples, MAX_SWEEP_TRIALS)
        if too_many:
            raise ValueError(too_many)
        sets, skipped = algorithm_sets(self)
        if not sets:
            reasons = "; ".join(f"{list(s) or '[]'}: {why}" for s, why in skipped[:5])
            raise ValueError(f"search.algorithms: every algorithm set breaks a rule, so nothing would run: {reasons}")
        if self.scheduler.name == "asha":
            problem = _asha_problem(self)
            if problem:
                raise ValueError(problem)
        searched = {name for s in sets for name in s}
        # Every refused param, not only the first: one line each, which the 422 turns into an item
        # each (api.validation_errors), named as a 422's field names it: search.params['optimizer.lr'],
        # search.params.seed.
        problems = [f"{join_field(('search', 'params', path))}: {problem}"
                    for path, domain in self.search.params.items()
                    if (problem := _param_problem(self, path, domain, searched))]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def metric_problems(sweep: SweepSpec) -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` for a metric the sweep would decide on the wrong way, or that its
    trials never report. Checked when a sweep is submitted (``POST /sweeps``) only: one stored
    before this check keeps running as it was asked to."""
    problems = []
    better = metric_mode(sweep.metric)
    own = sweep.metric.removeprefix("eval/")
    listed, any_own = reported_metric_names(sweep.base.eval_metrics)
    known = tesseras_own(own)  # your own metric's direction is yours
    if sweep.mode != better and known:
        problems.append(("mode", sweep.mode, f"{sweep.metric} is better when {'higher' if better == 'max' else 'lower'}: "
                         f"set mode {better!r} or leave it out"))
    domain = dataset_domain(sweep.base.data.train)
    if sweep.metric == "eval/perplexity" and domain != "text":
        problems.append(("metric", sweep.metric, f"only text data reports eval/perplexity, and data set "
                         f"{dataset_label(sweep.base.data.train)} is {domain}; use eval/accuracy or eval/loss"))
    named = f" (it lists {', '.join(sorted(listed))})" if listed else ""
    if own in BUILTIN_EVAL_METRICS and own not in listed:
        problems.append(("metric", sweep.metric, f"trials report {sweep.metric} only if base.eval_metrics lists "
                         f"{own!r}{named}; add it there, or decide on eval/accuracy or eval/loss"))
    elif not known and not any_own:
        problems.append(("metric", sweep.metric, f"no trial would report {sweep.metric}: it is no built-in metric, "
                         f"and base.eval_metrics lists none of your own that could return it{named}; decide on "
                         "eval/accuracy, eval/loss or one of the built-ins the base lists"))
    if sweep.base.data.eval is None:
        problems.append(("base.data.eval", None, f"trials report {sweep.metric} only with an eval data set; add "
                         "one (the same data set as train, e.g. its test split)"))
    return problems


def searched_imports(sweep: SweepSpec) -> dict[str, list[tuple[str, str]]]:
    """For each searched import (``model.import``, ``data.train.import``, ``data.eval.import``;
    only a grid or a choice can search one), ``(field, import path)`` for every value a trial may
    get, so that the service checks them against the code package in place of the base's own."""
    return {path: [(join_field(("search", "params", path, domain.kind)), value) for value in domain.extremes()]
            for path, domain in sweep.search.params.items() if path.endswith(".import")}


def grace_fraction(sweep: SweepSpec) -> float:
    """The ASHA grace period as a fraction of the base run's ``max_duration`` (Tune's time
    attribute is the reported ``time/progress``, 0..1)."""
    grace, total = sweep.scheduler.grace_period, sweep.base.max_duration
    if grace.unit is TimeUnit.DURATION:
        return float(grace.value)
    return float(grace.value) / float(total.value)


def _asha_problem(sweep: SweepSpec) -> str | None:
    grace, total = sweep.scheduler.grace_period, sweep.base.max_duration
    if grace.unit is not TimeUnit.DURATION and grace.unit is not total.unit:
        return (f"scheduler.grace_period {grace} must be in the unit of base.max_duration ({total}) "
                f"or a fraction like '0.25dur'")
    if not 0 < grace_fraction(sweep) < 1:
        return f"scheduler.grace_period {grace} must be more than 0 and less than base.max_duration ({total})"
    if sweep.base.eval_interval is None:
        return ("base.eval_interval is not set, but scheduler asha decides on evaluations; "
                "set it to at most the grace period (e.g. '1ep')")
    return None


# --- expanding the search ---------------------------------------------------------------

def algorithm_sets(sweep: SweepSpec) -> tuple[list[tuple[str, ...]], list[tuple[tuple[str, ...], str]]]:
    """(sets that make valid runs, [(skipped set, why)]). Without an algorithm search the only
    set is the base spec's own list."""
    if sweep.search.algorithms is None:
        return [tuple(a.name for a in sweep.base.algorithms)], []
    valid, skipped = [], []
    for algorithm_set in sweep.search.algorithms.candidate_sets():
        try:
            trial_spec(sweep.base, algorithm_set, {})
        except ValidationError as exc:
            skipped.append((algorithm_set, one_line(exc.errors())))
        else:
            valid.append(algorithm_set)
    return valid, skipped


def trial_spec(base: RunSpec, algorithm_set: tuple[str, ...] | list[str], params: dict[str, Any],
               *, name: str | None = None) -> RunSpec:
    """The RunSpec of one trial: the base with ``algorithm_set`` (each method keeps the base's
    hyperparameters if the base lists it, else its defaults) and ``params`` applied."""
    return RunSpec.model_validate(trial_body(base, algorithm_set, params, name=name))


def trial_body(base: RunSpec, algorithm_set: tuple[str, ...] | list[str], params: dict[str, Any],
               *, name: str | None = None) -> dict[str, Any]:
    """``trial_spec``'s body, before it is validated."""
    body = base.model_dump(mode="json")
    from_base = {a["name"]: a for a in body["algorithms"]}
    body["algorithms"] = [copy.deepcopy(from_base.get(n, {"name": n})) for n in algorithm_set]
    for path, value in params.items():
        _set_path(body, path, value)
    if name is not None:
        body["name"] = name
    return body


def _set_path(body: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    if parts[0] == "algorithms":
        # algorithms.<method>.<field>: applies only when the trial's set has the method.
        _, method, field = parts
        for algorithm in body["algorithms"]:
            if algorithm["name"] == method:
                algorithm[field] = value
        return
    node = body
    for key in parts[:-1]:
        node = node[key]
    node[parts[-1]] = value


def _param_problem(sweep: SweepSpec, path: str, domain: ParamDomain, searched: set[str]) -> str | None:
    parts = path.split(".")
    if parts[0] == "code":
        return ("the code package cannot be searched: every trial runs the base's code.digest, against "
                "which the service checks its imports; submit a sweep per package")
    if parts[0] == "algorithms":
        if len(parts) != 3:
            return "algorithm params are written algorithms.<method>.<field>"
        method, field = parts[1], parts[2]
        if method not in searched:
            return f"method {method!r} is in no algorithm set of this sweep"
        if field not in ALGORITHM_SPECS[method].model_fields or field == "name":
            allowed = ", ".join(f for f in ALGORITHM_SPECS[method].model_fields if f != "name") or "none"
            return f"{method!r} has no hyperparameter {field!r}; allowed: {allowed}"
        example_set = next(s for s in algorithm_sets(sweep)[0] if method in s)
    else:
        node: Any = sweep.base.model_dump(mode="json")
        for key in parts:
            if not isinstance(node, dict) or key not in node:
                return f"{path!r} is not a field of the base RunSpec"
            node = node[key]
        if isinstance(node, (dict, list)):
            return f"{path!r} is a section of the RunSpec; search one of its fields"
        example_set = tuple(a.name for a in sweep.base.algorithms)
    for value in domain.examples():
        body = trial_body(sweep.base, example_set, {path: value})
        try:
            RunSpec.model_validate(body)
        except ValidationError as exc:
            drawn = " (one drawn from inside the range)" if value not in domain.extremes() else ""
            why = "; ".join(f"{path}: {one_line([e])}" if (path := field_path(e["loc"], body)) else one_line([e])
                            for e in exc.errors())
            hint = ("; a range draws fractions: search an integer field with grid or choice"
                    if any(e["type"] == "int_from_float" for e in exc.errors()) else "")
            return f"value {value!r}{drawn} is not allowed: {why}{hint}"
    return None


# --- results ----------------------------------------------------------------------------

def pareto_front(points: dict[str, tuple[float, float]], mode: Literal["max", "min"]) -> list[str]:
    """Ids of the points not dominated on (metric, wall time): no other point has a metric at
    least as good and a time at least as short, with one of the two strictly better.

    ``points``: id → (metric, wall_time_s). Points with a NaN metric are never on the front.
    """
    sign = 1.0 if mode == "max" else -1.0
    scored = {k: (sign * m, t) for k, (m, t) in points.items() if not math.isnan(m)}

    def dominated(key: str) -> bool:
        m, t = scored[key]
        return any(om >= m and ot <= t and (om > m or ot < t) for other, (om, ot) in scored.items() if other != key)

    return sorted((k for k in scored if not dominated(k)), key=lambda k: scored[k][1])
