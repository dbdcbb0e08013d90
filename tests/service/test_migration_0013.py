"""Migration 0013 (how long a run trained, ``runs.trained_seconds`` and ``runs.training_since``),
on SQLite and PostgreSQL: each run that began training gets the seconds of its ended attempts
from its events (the worker's times where the row kept them), a run that trains now trains since
its open RUNNING (also one 0012 gave no attempt start), a queued one and one canceled while
starting trained no time; the service adds up from there; and it goes back down."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from sqlalchemy import inspect, text

from api.views import RunStatus
from service.db.engine import migrate
from service.repository import Repository
from tests.service.test_migration_0003 import _insert_old_run, _to, engine_at_0002  # noqa: F401  (fixture)

T0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=10)
MINUTE = timedelta(minutes=1)


def _naive(minutes: int) -> datetime:
    return (T0 + minutes * MINUTE).replace(tzinfo=None)


def _history(conn, run_id: str, changes: list[tuple[str | None, str, int, int]]) -> None:
    """``(from, to, attempt, minutes after T0)`` as run events, in order."""
    for from_status, to_status, attempt, minutes in changes:
        conn.execute(text("INSERT INTO run_events (run_id, from_status, to_status, attempt, time) "
                          "VALUES (:r, :f, :s, :a, :t)"),
                     {"r": run_id, "f": from_status, "s": to_status, "a": attempt, "t": _naive(minutes)})


def _row(conn, run_id: str, **columns) -> None:
    sets = ", ".join(f"{name} = :{name}" for name in columns)
    conn.execute(text(f"UPDATE runs SET {sets} WHERE id = :id"), {"id": run_id, **columns})


def test_0013_rebuilds_each_runs_training_from_its_events_and_the_service_adds_up_from_there(
        engine_at_0002, example_spec):
    _to(engine_at_0002, "0012")
    spec = example_spec.model_dump(mode="json")
    for run_id in ("one", "resumed", "restarted", "canceling", "canceling_at_0012", "early", "queued"):
        _insert_old_run(engine_at_0002, run_id, spec)
    with engine_at_0002.begin() as conn:
        # One attempt: 30 minutes by the worker's times (its RUNNING and COMPLETED were stored later).
        _row(conn, "one", started_at=_naive(1), finished_at=_naive(31))
        _history(conn, "one", [("QUEUED", "STARTING", 1, 0), ("STARTING", "RUNNING", 1, 2),
                               ("RUNNING", "RUNNING", 1, 3),  # a note: no change of status
                               ("RUNNING", "COMPLETED", 1, 40)])
        # Attempt 1 trained 20 minutes and its job was lost; queued 2 hours; attempt 2 trains since minute 150.
        _row(conn, "resumed", status="RUNNING", attempt=2, started_at=_naive(0), attempt_started_at=_naive(150))
        _history(conn, "resumed", [("QUEUED", "STARTING", 1, 0), ("STARTING", "RUNNING", 1, 0),
                                   ("RUNNING", "QUEUED", 2, 20), ("QUEUED", "STARTING", 2, 140),
                                   ("STARTING", "RUNNING", 2, 151)])
        # A worker-group restart at minute 10, a FAILED at 25, a resume, attempt 3 from 100 to its end at 130.
        _row(conn, "restarted", status="COMPLETED", attempt=3, started_at=_naive(0), finished_at=_naive(130))
        _history(conn, "restarted", [("STARTING", "RUNNING", 1, 0), ("RUNNING", "RESTARTING", 2, 9),
                                     ("RESTARTING", "RUNNING", 2, 10), ("RUNNING", "FAILED", 2, 25),
                                     ("FAILED", "QUEUED", 3, 60), ("STARTING", "RUNNING", 3, 100),
                                     ("RUNNING", "COMPLETED", 3, 131)])
        # Canceled after it began training: it trains until its job stops.
        _row(conn, "canceling", status="CANCELING", started_at=_naive(5), attempt_started_at=_naive(5))
        _history(conn, "canceling", [("STARTING", "RUNNING", 1, 5), ("RUNNING", "CANCELING", 1, 50)])
        # The same, but being canceled already when 0012 ran, which gave it no attempt_started_at:
        # it trains since its RUNNING, by the worker's time (started_at), not the event's.
        _row(conn, "canceling_at_0012", status="CANCELING", started_at=_naive(4))
        _history(conn, "canceling_at_0012", [("STARTING", "RUNNING", 1, 5), ("RUNNING", "CANCELING", 1, 50)])
        # Canceled while starting: it never trained.
        _row(conn, "early", status="CANCELING", attempt_started_at=_naive(5))
        _history(conn, "early", [("QUEUED", "STARTING", 1, 5), ("STARTING", "CANCELING", 1, 6)])
        _row(conn, "queued", status="QUEUED")
    migrate(engine_at_0002)

    repo = Repository(engine_at_0002)
    trained = {run_id: (repo.get_run(run_id).trained_seconds, repo.get_run(run_id).training_since)
               for run_id in ("one", "resumed", "restarted", "canceling", "canceling_at_0012", "early", "queued")}
    assert trained == {"one": (1800.0, None), "resumed": (1200.0, T0 + 150 * MINUTE),
                       "restarted": ((10 + 15 + 30) * 60.0, None), "canceling": (0.0, T0 + 5 * MINUTE),
                       "canceling_at_0012": (0.0, T0 + 4 * MINUTE),
                       "early": (0.0, None), "queued": (0.0, None)}

    # The service adds up from there: attempt 2 ends 30 minutes after it began, by its worker's word.
    done = repo.apply_worker_report("resumed", RunStatus.COMPLETED, ended_at=T0 + 180 * MINUTE)
    assert (done.trained_seconds, done.training_since) == (1200.0 + 1800.0, None)
    canceled = repo.transition("canceling", RunStatus.CANCELED)
    assert canceled.trained_seconds == (canceled.finished_at - (T0 + 5 * MINUTE)).total_seconds()
    assert repo.transition("early", RunStatus.CANCELED).trained_seconds == 0.0

    _to(engine_at_0002, "0012", down=True)
    _crowd(engine_at_0002, spec, CROWD)
    columns = {c["name"] for c in inspect(engine_at_0002).get_columns("runs")}
    assert not {"trained_seconds", "training_since"} & columns
    migrate(engine_at_0002)
    assert repo.get_run("resumed").trained_seconds == 3000.0  # rebuilt from the events again
    assert repo.get_run("canceling").training_since is None  # canceled by now
    with engine_at_0002.connect() as conn:  # every run of the crowd, read over several pages
        crowd = conn.execute(text("SELECT count(*), min(trained_seconds), max(trained_seconds) FROM runs "
                                  "WHERE id LIKE 'crowd%'")).one()
    assert tuple(crowd) == (CROWD, 60.0, 60.0)


CROWD = 1001  # more runs than the migration reads at once (500), and not a multiple of it


def _crowd(engine, spec: dict, count: int) -> None:
    """``count`` runs that each trained one minute, in one statement a table."""
    rows = [{"id": f"crowd{i:05d}", "spec": json.dumps(spec), "created": _naive(0), "started": _naive(1),
             "finished": _naive(2)} for i in range(count)]
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, name, status, attempt, spec, summary, tags, created_at, updated_at, "
                          "started_at, finished_at) VALUES (:id, 'crowd', 'COMPLETED', 1, :spec, '{}', '[]', "
                          ":created, :created, :started, :finished)"), rows)
        conn.execute(text("INSERT INTO run_events (run_id, from_status, to_status, attempt, time) "
                          "VALUES (:id, :f, :s, 1, :t)"),
                     [{"id": row["id"], "f": f, "s": to, "t": _naive(minute)} for row in rows
                      for f, to, minute in (("STARTING", "RUNNING", 1), ("RUNNING", "COMPLETED", 3))])
