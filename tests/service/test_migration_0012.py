"""Migration 0012 (when a run's current attempt began, ``runs.attempt_started_at``): a run in a job
gets its latest STARTING or RUNNING event's time, so its end is still kept after its attempt
began; a queued or ended run keeps none; and it goes back down."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import inspect, text

from api.views import RunStatus
from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)

FIVE_HOURS_AGO = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=5)


def _event(conn, run_id: str, to_status: str, attempt: int, hours: int) -> None:
    conn.execute(text("INSERT INTO run_events (run_id, to_status, attempt, time) VALUES (:r, :s, :a, :t)"),
                 {"r": run_id, "s": to_status, "a": attempt,
                  "t": (FIVE_HOURS_AGO + timedelta(hours=hours)).replace(tzinfo=None)})


def test_0012_gives_runs_in_a_job_their_attempts_start_and_leaves_the_others_none(engine_at_0002, example_spec):
    _to(engine_at_0002, "0011")
    spec = example_spec.model_dump(mode="json")
    for run_id in ("resumed", "starting", "done", "queued"):
        _insert_old_run(engine_at_0002, run_id, spec)
    with engine_at_0002.begin() as conn:
        # Resumed: attempt 1 ran 5 hours ago, attempt 2 was submitted 3 hours ago and RUNNING 2 hours ago.
        conn.execute(text("UPDATE runs SET status = 'RUNNING', attempt = 2, started_at = :t WHERE id = 'resumed'"),
                     {"t": FIVE_HOURS_AGO.replace(tzinfo=None)})
        for to_status, attempt, hours in [("STARTING", 1, 0), ("RUNNING", 1, 0), ("FAILED", 1, 1), ("QUEUED", 2, 1),
                                          ("STARTING", 2, 2), ("RUNNING", 2, 3)]:
            _event(conn, "resumed", to_status, attempt, hours)
        conn.execute(text("UPDATE runs SET status = 'STARTING' WHERE id = 'starting'"))
        conn.execute(text("UPDATE runs SET status = 'QUEUED', attempt = 2 WHERE id = 'queued'"))
        _event(conn, "queued", "STARTING", 1, 0)  # attempt 1's: none of attempt 2 has begun
        _event(conn, "starting", "STARTING", 1, 4)
        _event(conn, "done", "RUNNING", 1, 0)  # COMPLETED, as _insert_old_run makes it
    migrate(engine_at_0002)

    repo = Repository(engine_at_0002)
    assert repo.get_run("resumed").attempt_started_at == FIVE_HOURS_AGO + timedelta(hours=3)
    assert repo.get_run("starting").attempt_started_at == FIVE_HOURS_AGO + timedelta(hours=4)
    assert repo.get_run("done").attempt_started_at is None and repo.get_run("queued").attempt_started_at is None
    # A worker whose clock is behind: its end is kept at attempt 2's start, not at the run's first.
    ended = repo.apply_worker_report("resumed", RunStatus.COMPLETED, ended_at=FIVE_HOURS_AGO + timedelta(hours=1))
    assert ended.finished_at == FIVE_HOURS_AGO + timedelta(hours=3)

    _to(engine_at_0002, "0011", down=True)
    assert "attempt_started_at" not in {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    migrate(engine_at_0002)
    assert repo.get_run("resumed").attempt_started_at is None  # what went down with the column is not made up
