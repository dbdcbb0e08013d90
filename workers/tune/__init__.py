"""The Ray Tune sweep driver: a ``SweepSpec`` → a Tune experiment whose trials are Tessera runs.

    from workers.tune import run_sweep
    outcome = run_sweep(spec)                  # just Tune (benchmarks, notebooks)
    outcome = run_sweep(spec, client=client)   # an ``external`` sweep the service shows
    outcome.best, outcome.pareto, outcome.trials

The service runs ``python -m workers.tune --sweep-id ID`` as a Ray job (``drive_sweep``). The
parts: ``space`` (search space, scheduler, concurrency), ``trial`` (one trial's body),
``reporting`` (trial ends, sweep status and cancel polling with the service), ``outcome``
(what the sweep found) and ``driver`` (running or restoring Tune; the entry points).
"""

from workers.tune.driver import drive_sweep, main, run_sweep
from workers.tune.outcome import SweepOutcome, TrialOutcome
from workers.tune.space import (PROGRESS, TRIAL_ACTOR_CPUS, build_param_space, build_scheduler,
                                max_concurrent_trials)

__all__ = ["PROGRESS", "TRIAL_ACTOR_CPUS", "SweepOutcome", "TrialOutcome", "build_param_space", "build_scheduler",
           "drive_sweep", "main", "max_concurrent_trials", "run_sweep"]
