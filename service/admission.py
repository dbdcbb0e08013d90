"""The admission queue: which QUEUED runs go to Ray this tick, and why the others wait.

A run is admitted only when the cluster has room for it: its workers' CPUs and GPUs fit next
to what the runs already admitted hold. ``plan`` decides, as a pure function of the queued
runs, the active runs, the cluster's total resources and the projects' quotas:

* order: higher ``priority`` first; at equal priority the projects take turns (round-robin,
  the project with fewer active runs first), each project's runs oldest first;
* a run whose project is at a quota (``max_running_runs``, ``max_workers``, ``max_gpus``)
  waits with reason ``quota`` and does not hold up other projects;
* the first run that does not fit the free resources waits with reason ``resources``, and
  every later run waits behind it (reason ``priority``, or ``resources`` if it would not fit
  either): a small run never starves a big one of higher or equal rank;
* a run bigger than the whole cluster (it shrank after the run was accepted) waits with
  reason ``resources`` and a detail saying so, without holding up the rest;
* with an autoscaler (``TESSERA_AUTOSCALER``), the first run in order that does not fit is
  admitted all the same, for Ray's autoscaler to add the nodes it asks for (it waits in
  STARTING while they come up), and the runs behind it wait as behind any run that does not
  fit: the cluster grows for one run at a time, in the queue's order.

Sweeps wait in the same queue: a QUEUED sweep whose driver the service runs is a candidate
with its base run's demand (one trial's workers: the least it needs to make progress), its
base's priority and its project. A sweep is one run to ``max_running_runs`` from its admission
until it ends (STARTING, RUNNING, CANCELING), whether its driver has registered trials yet or
not: its driver's trials count under it, not as runs of their own, so with
``max_running_runs=1`` a service-driven sweep and a plain run of one project never train at
once, whichever came first. An external driver's sweep (a notebook's) never queues and has no
job the service follows: it is one run while it has active trials, else none, so a notebook
that died holds nothing. Its trials hold the cluster's CPUs and GPUs, and
the project's ``max_workers`` and ``max_gpus``, like any other run. A service-driven sweep with
no active trial (its driver starting, or between trials) holds one trial's demand in their
place, as when it was admitted: another run does not take the room its first trial was
admitted for. A trial resumed by hand has its own job and is an ordinary run again.

Resources are accounted from the runs Tessera admitted, against the cluster's total, not
from Ray's "available" figure: that lags a submission by seconds (a job's workers are placed
after it starts), and would let one tick admit more than the cluster holds. A Ray Train run
on N workers holds N x ``cpus_per_worker`` CPUs and N GPUs with ``use_gpu``; its job driver
and Ray Train's controller (``num_cpus=0`` in Ray 2.60) hold none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.views import ACTIVE_SWEEP_STATUSES, QueueInfo, SweepStatus

PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class Demand:
    """What one run holds while it trains."""

    cpus: float
    gpus: float
    workers: int

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> "Demand":
        parallelism = spec.get("parallelism", {})
        workers = int(parallelism.get("num_workers", 1))
        cpus = workers * float(parallelism.get("cpus_per_worker", 1))
        return cls(cpus=cpus, gpus=float(workers) if parallelism.get("use_gpu") else 0.0, workers=workers)


@dataclass(frozen=True)
class Capacity:
    """The cluster's total logical CPUs and GPUs (alive nodes)."""

    cpus: float
    gpus: float

    def holds(self, demand: Demand) -> bool:
        return demand.cpus <= self.cpus and demand.gpus <= self.gpus

    def why_never(self, demand: Demand) -> str | None:
        """Why ``demand`` can never run on this cluster as it is, or None if it can."""
        if demand.cpus > self.cpus:
            return f"asks for {demand.cpus:g} CPUs (num_workers x cpus_per_worker); the cluster has {self.cpus:g}"
        if demand.gpus > self.gpus:
            return f"asks for {demand.gpus:g} GPUs (one per worker); the cluster has {self.gpus:g}"
        return None


@dataclass(frozen=True)
class Quota:
    max_running_runs: int | None = None
    max_workers: int | None = None
    max_gpus: int | None = None


@dataclass(frozen=True)
class Candidate:
    """A run or a sweep as the queue sees it. ``sweep_id``: the sweep it counts under for
    ``max_running_runs``, a sweep's own id or a driver's trial's sweep (None: a run of its own)."""

    id: str
    project: str
    priority: str
    demand: Demand
    sweep_id: str | None = None

    @property
    def holder(self) -> str:
        """What ``max_running_runs`` counts it as: its sweep (every trial of a sweep is the same
        one run, the sweep itself too), else the run."""
        return self.sweep_id or self.id


@dataclass
class Usage:
    """What active runs and sweeps hold: resources summed, runs counted once per ``holder``."""

    cpus: float = 0.0
    gpus: float = 0.0
    workers: int = 0
    holders: set[str] = field(default_factory=set)
    sweeps: set[str] = field(default_factory=set)  # the holders that are sweeps

    @property
    def runs(self) -> int:
        return len(self.holders)

    def add(self, run: Candidate) -> None:
        self.cpus += run.demand.cpus
        self.gpus += run.demand.gpus
        self.workers += run.demand.workers
        self.holders.add(run.holder)
        if run.sweep_id is not None:
            self.sweeps.add(run.sweep_id)


@dataclass
class Plan:
    admit: list[str] = field(default_factory=list)
    waiting: dict[str, QueueInfo] = field(default_factory=dict)


def quota_problem(quota: Quota, used: Usage, run: Candidate) -> str | None:
    """Which of its project's quotas ``run`` would exceed next to ``used`` (None: none). A sweep
    whose trials outlived its last driver (re-queued) is already counted: it adds no run."""
    demand = run.demand
    runs = used.runs + (run.holder not in used.holders)
    if quota.max_running_runs is not None and runs > quota.max_running_runs:
        return f"the project runs {used.runs} of max_running_runs={quota.max_running_runs}{_sweeps_among(used)}"
    if quota.max_workers is not None and used.workers + demand.workers > quota.max_workers:
        return f"the project's runs hold {used.workers} of max_workers={quota.max_workers} workers"
    if quota.max_gpus is not None and used.gpus + demand.gpus > quota.max_gpus:
        return f"the project's runs hold {used.gpus:g} of max_gpus={quota.max_gpus} GPUs"
    return None


def _sweeps_among(used: Usage) -> str:
    """How many of the runs a project is said to run are sweeps: its trials listed as running
    would otherwise not add up to the count."""
    named = ", ".join(sorted(used.sweeps))
    if not used.sweeps:
        return ""
    if len(used.sweeps) == 1:
        return f" (one of them sweep {named}, which counts as one run with all its trials)"
    return f" ({len(used.sweeps)} of them sweeps {named}, each one run with all its trials)"


def queue_order(queued: Iterable[Candidate], active_per_project: Mapping[str, int]) -> list[Candidate]:
    """Priority first; within a priority, one run per project per round (projects with fewer
    active runs first, then by name), each project's runs in the order given (oldest first)."""
    ordered: list[Candidate] = []
    by_priority: dict[int, dict[str, list[Candidate]]] = defaultdict(lambda: defaultdict(list))
    for run in queued:
        by_priority[PRIORITY_RANK.get(run.priority, 1)][run.project].append(run)
    for rank in sorted(by_priority):
        lanes = by_priority[rank]
        projects = sorted(lanes, key=lambda name: (active_per_project.get(name, 0), name))
        depth = max(len(lane) for lane in lanes.values())
        for index in range(depth):
            ordered.extend(lanes[name][index] for name in projects if index < len(lanes[name]))
    return ordered


def plan(queued: list[Candidate], active: list[Candidate], capacity: Capacity | None,
         quotas: Mapping[str, Quota], *, grow: bool = False) -> Plan:
    """Which of ``queued`` (oldest first) to admit now, and why each other one waits.
    ``capacity`` None: the cluster's size is unknown, so only quotas and order apply. ``grow``:
    the cluster autoscales, so the first run in order that does not fit it now is admitted all
    the same (Ray's autoscaler adds nodes for what is asked of it; held back here, nothing would
    be asked), and the runs behind it wait their turn, as behind any run that does not fit.
    ``active``: the runs that hold the cluster, and the active sweeps, which hold a run of
    ``max_running_runs`` (their trials, with ``sweep_id`` set, hold the cluster; a sweep with no
    active trial holds one trial's demand itself: ``Admission``'s ``_active_sweep``)."""
    total, per_project = Usage(), defaultdict(Usage)
    for run in active:
        total.add(run)
        per_project[run.project].add(run)
    result = Plan()
    # Runs admitted beyond the cluster's size: it is growing for one of them already.
    growing = capacity is not None and (total.cpus > capacity.cpus or total.gpus > capacity.gpus)
    blocked = False
    ordered = queue_order(queued, {name: used.runs for name, used in per_project.items()})
    for run in ordered:
        never = capacity.why_never(run.demand) if capacity is not None and not grow else None
        problem = quota_problem(quotas.get(run.project, Quota()), per_project[run.project], run)
        fits = capacity is None or Capacity(capacity.cpus - total.cpus, capacity.gpus - total.gpus).holds(run.demand)
        if never is not None:
            result.waiting[run.id] = QueueInfo(position=0, reason="resources", detail=f"{never}; waiting for it to grow")
        elif problem is not None:
            result.waiting[run.id] = QueueInfo(position=0, reason="quota", detail=problem)
        elif blocked or not (fits or (grow and not growing)):
            reason = "resources" if not fits else "priority"
            detail = ("the cluster grows for a run ahead of it" if growing else
                      f"needs {run.demand.cpus:g} CPUs and {run.demand.gpus:g} GPUs; free: "
                      f"{capacity.cpus - total.cpus:g} CPUs, {capacity.gpus - total.gpus:g} GPUs") if not fits \
                else "runs ahead of it in the queue go first"
            result.waiting[run.id] = QueueInfo(position=0, reason=reason, detail=detail)
            blocked = True
        else:
            growing = growing or not fits
            result.admit.append(run.id)
            total.add(run)
            per_project[run.project].add(run)
    position = 0
    for run in ordered:
        if run.id in result.waiting:
            position += 1
            result.waiting[run.id] = result.waiting[run.id].model_copy(update={"position": position})
    return result


class Admission:
    """The dispatcher's side of the queue: reads the cluster's size (one call per tick), the
    active runs and the quotas, and keeps the last ``plan``'s reasons for ``RunView.queue``."""

    def __init__(self, repo: Any, jobs: Any, access: Any, *, sweeps: Any = None, autoscaler: bool = False):
        self.repo, self.jobs, self.access, self.sweeps = repo, jobs, access, sweeps
        self.autoscaler = autoscaler
        self.capacity: Capacity | None = None  # last known; None until Ray has answered once
        self.waiting: dict[str, QueueInfo] = {}  # run and sweep ids (both random: they never collide)
        self._admitted_sweeps: set[str] = set()  # from this tick's plan, for ``admit_sweeps``

    def read_capacity(self) -> Capacity | None:
        """Ask Ray for the cluster's size; keep the last answer when Ray cannot be asked. A Jobs
        client without ``cluster_capacity`` (tests' fakes) means an unknown size."""
        reader = getattr(self.jobs, "cluster_capacity", None)
        if reader is not None:
            try:
                self.capacity = Capacity(*reader())
            except Exception as exc:  # Ray unreachable: decide on what it said last
                import logging

                logging.getLogger(__name__).warning("could not read the cluster's resources: %s", exc)
        return self.capacity

    def never_fits(self, spec: Mapping[str, Any]) -> str | None:
        """Why a run of ``spec`` can never run on the cluster as last seen (None: it can, the
        size is unknown, or an autoscaler may grow the cluster)."""
        if self.autoscaler:
            return None
        capacity = self.capacity or self.read_capacity()
        return capacity.why_never(Demand.of(spec)) if capacity is not None else None

    def __call__(self, queued: list[Any], active: list[Any] | None = None, *, fresh_capacity: bool = True) -> list[Any]:
        """The runs of ``queued`` (oldest first) to submit now, in queue order. ``active``: every
        active run as the run follower read it this tick (None: read here). Plans the service's
        QUEUED sweeps in the same pass; ``admit_sweeps`` then hands those out.
        ``fresh_capacity=False``: plan with the cluster's size as last read."""
        from api.views import ACTIVE_STATUSES

        sweeps, active_sweeps = self._sweeps()
        self._admitted_sweeps = set()
        if not queued and not sweeps:
            self.waiting = {}
            return []
        # Every tick with a queue, so a submit is checked against a fresh size.
        capacity = self.read_capacity() if fresh_capacity else self.capacity
        holding = [_candidate(run) for run in (self.repo.snapshots(ACTIVE_STATUSES) if active is None else active)]
        training = {candidate.sweep_id for candidate in holding if candidate.sweep_id is not None}
        holding += [_active_sweep(sweep, reserves=sweep.id not in training) for sweep in active_sweeps]
        quotas = {p.name: Quota(p.max_running_runs, p.max_workers, p.max_gpus) for p in self.access.list_projects()}
        candidates = sorted([(run.created_at, _candidate(run)) for run in queued]
                            + [(sweep.created_at, _sweep_candidate(sweep)) for sweep in sweeps],
                            key=lambda pair: pair[0])  # oldest first across both kinds
        decided = plan([candidate for _, candidate in candidates], holding, capacity, quotas, grow=self.autoscaler)
        self.waiting = decided.waiting
        self._admitted_sweeps = {sweep.id for sweep in sweeps} & set(decided.admit)
        by_id = {run.id: run for run in queued}
        return [by_id[run_id] for run_id in decided.admit if run_id in by_id]

    def admit_sweeps(self, queued: list[Any], active: list[Any] | None = None) -> list[Any]:
        """The sweeps of ``queued`` that this tick's plan admitted (the run follower plans first)."""
        admitted = [sweep for sweep in queued if sweep.id in self._admitted_sweeps]
        self._admitted_sweeps = set()
        return admitted

    def _sweeps(self) -> tuple[list[Any], list[Any]]:
        """The QUEUED sweeps the service drives (candidates), and the active sweeps (one run each
        to their projects' ``max_running_runs``, trials or not yet): one read of both."""
        if self.sweeps is None:
            return [], []
        read = self.sweeps.snapshots([SweepStatus.QUEUED, *ACTIVE_SWEEP_STATUSES])
        service = [sweep for sweep in read if sweep.driver == "service"]
        # An external sweep counts through its active trials only: it is RUNNING from its creation,
        # with no job the service follows, so one whose notebook died would hold its project's
        # max_running_runs forever.
        return ([sweep for sweep in service if sweep.status is SweepStatus.QUEUED],
                [sweep for sweep in service if sweep.status in ACTIVE_SWEEP_STATUSES])


def _sweep_candidate(sweep: Any) -> Candidate:
    """A QUEUED sweep: one trial's demand, and one run of its project (its own, or the one its
    trials that outlived its last driver already hold)."""
    base = sweep.spec.get("base", {})
    return Candidate(id=sweep.id, project=sweep.project, priority=str(base.get("priority", "normal")),
                     demand=Demand.of(base), sweep_id=sweep.id)


def _active_sweep(sweep: Any, *, reserves: bool) -> Candidate:
    """An active sweep holds one run of its project from its admission on, before its driver has
    registered a trial too. What it holds of the cluster its trials hold (they are active runs);
    ``reserves`` (no trial active): one trial's demand, which it was admitted with."""
    base = sweep.spec.get("base", {})
    return Candidate(id=sweep.id, project=sweep.project, priority=str(base.get("priority", "normal")),
                     demand=Demand.of(base) if reserves else Demand(cpus=0.0, gpus=0.0, workers=0),
                     sweep_id=sweep.id)


def _candidate(run: Any) -> Candidate:
    """A run; a trial its sweep's driver trains counts under the sweep (a trial resumed by hand
    is a run of its own: ``driven_by_sweep`` is false then)."""
    return Candidate(id=run.id, project=run.project, priority=str(run.spec.get("priority", "normal")),
                     demand=Demand.of(run.spec), sweep_id=run.sweep_id if run.driven_by_sweep else None)
