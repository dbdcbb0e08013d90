"""Limits on what one run's metric reports may store, and the note a non-finite value leaves.

A report is refused whole (nothing stored) when it would take the run past a limit; the
refusal is a 4xx naming the limit and its setting, which a worker treats as final (it retries
only 5xx and 429), so a run that hit its budget cannot loop on retries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from api.views import ReportedMetric


class MetricLimitExceeded(Exception):
    """A report that would break a limit: ``status_code`` (413 or 422) and a ``detail``."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail


@dataclass(frozen=True)
class MetricLimits:
    """``max_keys``: distinct keys per run; ``max_points_per_report``; ``max_points``: the
    run's point budget over all its attempts."""

    max_keys: int
    max_points_per_report: int
    max_points: int

    def check_report_size(self, points: list[ReportedMetric]) -> None:
        if len(points) > self.max_points_per_report:
            raise MetricLimitExceeded(413, f"a metrics report holds at most {self.max_points_per_report} points "
                                           f"(TESSERA_MAX_POINTS_PER_REPORT); got {len(points)}: send smaller batches")

    def check_run(self, run_id: str, known_keys: Iterable[str], stored: int, points: list[ReportedMetric]) -> None:
        """Refuse ``points`` if with them the run would have more than ``max_keys`` distinct keys
        or ``max_points`` stored points (``stored`` now)."""
        keys = set(known_keys)
        new_keys = sorted({p.key for p in points} - keys)
        if len(keys) + len(new_keys) > self.max_keys:
            shown = ", ".join(repr(k) for k in new_keys[:5]) + (" …" if len(new_keys) > 5 else "")
            raise MetricLimitExceeded(422, f"run {run_id} may report at most {self.max_keys} distinct metric keys "
                                           f"(TESSERA_MAX_METRIC_KEYS_PER_RUN); it has {len(keys)} and this report "
                                           f"adds {len(new_keys)}: {shown}")
        if stored + len(points) > self.max_points:
            raise MetricLimitExceeded(422, f"run {run_id} has used its budget of {self.max_points} metric points "
                                           f"(TESSERA_MAX_POINTS_PER_RUN): {stored} stored, this report has "
                                           f"{len(points)}; report less often")


def non_finite_note(points: Iterable[ReportedMetric]) -> str | None:
    """One line naming each key that had a NaN or infinite value and the first step it did, e.g.
    ``non-finite train/loss at step 12 (nan)``; None when every value is finite."""
    seen: dict[str, list] = {}  # key -> [lowest step, its value, how many points]
    for point in points:
        if math.isfinite(point.value):
            continue
        entry = seen.setdefault(point.key, [point.step, point.value, 0])
        if point.step < entry[0]:
            entry[0], entry[1] = point.step, point.value
        entry[2] += 1
    if not seen:
        return None
    parts = []
    for key, (step, value, count) in sorted(seen.items()):
        more = f", {count} points" if count > 1 else ""
        parts.append(f"non-finite {key} at step {step} ({value}{more})")
    return "; ".join(parts)[:2000]
