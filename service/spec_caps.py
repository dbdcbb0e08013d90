"""Upper bounds on what one run may ask for: its wall-clock limit and its ``max_duration``.

Each bound is the service's setting unless the run's project has its own, which only an admin
of every project (``*``) may set (``PUT /projects/{name}/quota``): a lab's operator decides who
may book the cluster for a week. ``spec_cap_problems`` is the one check; run submits, sweeps
(the base spec and every searched ``max_duration`` value) and forks all call it, so a cap can
never be side-stepped by asking through another route.
"""

from __future__ import annotations

from typing import Any

from api.specs import RunSpec, wall_time_seconds
from api.time import Time, TimeUnit
from api.validation_errors import body_error

# The service's default bounds per unit: generous for real work, small enough that a typo
# ("1000000ep") is caught at submit instead of holding workers for a year.
DEFAULT_DURATION_CAPS: dict[str, int] = {"ep": 10_000, "ba": 100_000_000, "sp": 100_000_000_000,
                                         "tok": 10_000_000_000_000}
RAISE_HINT = "an admin of every project can raise it in the project's quota"


def wall_time_cap(settings: Any, project: Any) -> int | None:
    """The longest ``max_wall_time`` (seconds) a run of ``project`` may ask for; None: no cap."""
    if project is not None and project.max_wall_time_cap_s is not None:
        return project.max_wall_time_cap_s
    return settings.max_wall_time_s


def duration_cap(settings: Any, project: Any, unit: TimeUnit) -> int:
    """The largest ``max_duration`` in ``unit`` a run of ``project`` may ask for."""
    raised = (project.max_duration_caps or {}) if project is not None else {}
    if unit.value in raised:
        return int(raised[unit.value])
    return int({**DEFAULT_DURATION_CAPS, **settings.max_duration_caps}[unit.value])


def duration_problem(settings: Any, project: Any, duration: Time) -> str | None:
    """Why ``duration`` is more than ``project``'s runs may ask for, or None."""
    cap = duration_cap(settings, project, duration.unit)
    if duration.value <= cap:
        return None
    name = project.name if project is not None else "this project"
    return (f"max_duration {duration} is more than project {name} may ask for: at most {cap}{duration.unit.value} "
            f"({RAISE_HINT}: max_duration_caps)")


def spec_cap_problems(settings: Any, project: Any, spec: RunSpec, *, prefix: str = "") -> list[dict[str, Any]]:
    """422 items for each bound ``spec`` passes (``prefix``: where the spec sits in the body)."""
    problems = []
    too_long = duration_problem(settings, project, spec.max_duration)
    if too_long:
        problems.append(body_error(prefix + "max_duration", too_long, str(spec.max_duration)))
    cap = wall_time_cap(settings, project)
    if spec.max_wall_time is not None and cap is not None and wall_time_seconds(spec.max_wall_time) > cap:
        problems.append(body_error(prefix + "max_wall_time",
                              f"max_wall_time {spec.max_wall_time} is more than project {project.name} may ask "
                              f"for: at most {cap}s ({RAISE_HINT}: max_wall_time_cap_s)", spec.max_wall_time))
    return problems


def searched_duration_problems(settings: Any, project: Any, values: list[Any], *, field: str) -> list[dict[str, Any]]:
    """422 items for searched ``max_duration`` values (a sweep's grid or choice) past the cap."""
    problems = []
    for value in values:
        try:
            duration = Time.parse(value)
        except ValueError:
            continue  # the sweep's own validation has already refused it
        why = duration_problem(settings, project, duration)
        if why:
            problems.append(body_error(field, why, value))
    return problems
