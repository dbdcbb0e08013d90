"""The data layer on both SQLite and PostgreSQL: runs, events, pagination, tokens, metrics."""

from __future__ import annotations

import hashlib
import struct
import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy import func, select, text

from api.views import ReportedMetric, RunStatus
from service import run_writes
from service.db.engine import make_engine
from service.db.models import Metric, Run, RunEvent
from service.db.session import Database
from service.repository import InvalidCursor, RunNotFound
from service.state_machine import IllegalTransition

S = RunStatus
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


def _count(repo, model) -> int:
    with repo.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(model)).scalar_one()


def _points(*pairs: tuple[str, float], step: int = 0) -> list[ReportedMetric]:
    return [ReportedMetric(step=step + i, key=key, value=value, time=T0) for i, (key, value) in enumerate(pairs)]


def _running(repo, spec):
    run = repo.create_run(spec)
    repo.begin_attempt(run.id, token="tok-1")
    return repo.transition(run.id, S.RUNNING)


def test_created_run_is_queued_on_attempt_one_with_its_first_event(repo, example_spec):
    run = repo.create_run(example_spec)
    assert run.status is S.QUEUED and run.attempt == 1 and run.name == "digits-resnet"
    assert run.spec["optimizer"] == {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005,
                                     "nesterov": False}
    assert run.created_at.tzinfo is not None and run.started_at is None
    assert repo.get_run(run.id) == run
    [event] = repo.events(run.id)
    assert (event.from_status, event.to_status, event.attempt) == (None, S.QUEUED, 1)
    # Columns left out are SQL NULL, not JSON 'null' (what an explicit None in a JSON column stores).
    with repo.engine.connect() as conn:
        unset = select(Run.id).where(Run.fork.is_(None), Run.trial_params.is_(None), Run.notes.is_(None))
        assert conn.execute(unset).scalars().all() == [run.id]


def test_a_create_that_fails_midway_leaves_nothing_behind(repo, example_spec, monkeypatch):
    insert = run_writes.insert

    def insert_failing_for_events(table):  # the run's row is written, then its event fails
        if table is RunEvent.__table__:
            raise RuntimeError("disk full")
        return insert(table)

    monkeypatch.setattr(run_writes, "insert", insert_failing_for_events)
    with pytest.raises(RuntimeError, match="disk full"):
        repo.create_run(example_spec)
    assert repo.list_runs() == ([], None)
    assert _count(repo, Run) == 0 and _count(repo, RunEvent) == 0


def test_unknown_run_is_not_found_everywhere(repo):
    for read in (repo.get_run, repo.events, repo.metrics_after):
        with pytest.raises(RunNotFound, match="^run nope not found$"):
            read("nope")
    with pytest.raises(RunNotFound):
        repo.transition("nope", S.CANCELING)


def test_list_pages_newest_first_through_opaque_cursors(repo, example_spec):
    ids = [repo.create_run(example_spec).id for _ in range(5)]
    seen, cursor, pages = [], None, 0
    while True:
        page, cursor = repo.list_runs(limit=2, cursor=cursor)
        seen += [run.id for run in page]
        pages += 1
        if cursor is None:
            break
    assert seen == ids[::-1] and pages == 3


def test_list_filters_by_status(repo, example_spec):
    queued = repo.create_run(example_spec)
    canceled = repo.create_run(example_spec)
    repo.transition(canceled.id, S.CANCELING)
    assert [r.id for r in repo.list_runs(status=S.QUEUED)[0]] == [queued.id]
    assert [r.id for r in repo.list_runs(status=S.CANCELING)[0]] == [canceled.id]


def test_a_cursor_the_service_did_not_issue_is_refused(repo):
    with pytest.raises(InvalidCursor, match="next_cursor"):
        repo.list_runs(cursor="not-a-cursor!")


def test_transitions_record_events_and_timestamps(repo, example_spec):
    run = _running(repo, example_spec)
    assert run.status is S.RUNNING and run.started_at is not None and run.finished_at is None
    assert run.ray_job_id == f"run-{run.id}-attempt-1"
    done = repo.transition(run.id, S.COMPLETED, message="worker reported COMPLETED")
    assert done.finished_at is not None and done.finished_at >= done.started_at
    events = repo.events(run.id)
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, S.QUEUED), (S.QUEUED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.COMPLETED)]
    assert events[-1].message == "worker reported COMPLETED"
    assert [e.seq for e in events] == sorted(e.seq for e in events)


def test_illegal_transition_changes_nothing(repo, example_spec):
    run = repo.create_run(example_spec)
    with pytest.raises(IllegalTransition, match="is QUEUED; cannot complete"):
        repo.transition(run.id, S.COMPLETED)
    assert repo.get_run(run.id).status is S.QUEUED and len(repo.events(run.id)) == 1


def test_repeated_running_report_is_a_no_op_without_event(repo, example_spec):
    run = _running(repo, example_spec)
    again = repo.transition(run.id, S.RUNNING)
    assert again.status is S.RUNNING and len(repo.events(run.id)) == 3


def test_requeue_starts_a_new_attempt_and_revokes_the_old_token(repo, example_spec):
    run = _running(repo, example_spec)
    requeued = repo.transition(run.id, S.QUEUED, message="Ray job not found")
    assert requeued.attempt == 2 and requeued.status is S.QUEUED
    assert not repo.check_token(run.id, "tok-1")
    assert repo.events(run.id)[-1].attempt == 2
    restarted = repo.begin_attempt(run.id, token="tok-2")
    assert restarted.ray_job_id == f"run-{run.id}-attempt-2" and repo.check_token(run.id, "tok-2")


def test_failure_error_is_kept_and_cleared_on_resume(repo, example_spec):
    run = _running(repo, example_spec)
    failed = repo.transition(run.id, S.FAILED, error="CUDA out of memory\nat step 12")
    assert failed.error == "CUDA out of memory\nat step 12"
    assert repo.events(run.id)[-1].message == "CUDA out of memory"
    resumed = repo.transition(run.id, S.QUEUED, message="resume")
    assert resumed.error is None and resumed.finished_at is None and resumed.attempt == 2


def test_compare_and_set_refuses_when_the_run_moved_on(repo, example_spec):
    run = _running(repo, example_spec)
    repo.transition(run.id, S.COMPLETED)
    with pytest.raises(IllegalTransition):
        repo.transition(run.id, S.FAILED, only_from=[S.RUNNING], attempt=1)
    with pytest.raises(IllegalTransition, match="attempt 1, not 7"):
        repo.transition(run.id, S.COMPLETED, attempt=7)
    assert repo.get_run(run.id).status is S.COMPLETED


def test_only_the_hash_of_a_token_is_stored_and_checks_are_exact(repo, example_spec):
    run = repo.create_run(example_spec)
    assert not repo.check_token(run.id, "secret-token")  # no token yet
    repo.set_token(run.id, "secret-token")
    assert repo.check_token(run.id, "secret-token")
    assert not repo.check_token(run.id, "secret-tokem") and not repo.check_token("other", "secret-token")
    with repo.engine.connect() as conn:
        stored = conn.execute(select(Run.token_hash).where(Run.id == run.id)).scalar_one()
    assert stored == hashlib.sha256(b"secret-token").hexdigest()


def test_metrics_after_returns_only_new_points_in_order(repo, example_spec):
    run = _running(repo, example_spec)
    other = _running(repo, example_spec)
    assert repo.add_metrics(run.id, _points(("loss", 2.0), ("loss", 1.5), ("acc", 0.3))) == 3
    repo.add_metrics(other.id, _points(("loss", 9.0)))
    first, last_seq = repo.metrics_after(run.id, after=0)
    assert [(p.key, p.value) for p in first] == [("loss", 2.0), ("loss", 1.5), ("acc", 0.3)]
    assert last_seq == first[-1].seq and first[0].time == T0

    repo.add_metrics(run.id, _points(("loss", 1.0), ("acc", 0.6), step=3))
    new, newer_seq = repo.metrics_after(run.id, after=last_seq)
    assert [(p.step, p.key, p.value) for p in new] == [(3, "loss", 1.0), (4, "acc", 0.6)]
    assert repo.metrics_after(run.id, after=newer_seq) == ([], newer_seq)
    limited, limited_seq = repo.metrics_after(run.id, after=0, limit=2)
    assert len(limited) == 2 and limited_seq == limited[-1].seq


def test_points_keep_any_key_their_order_and_their_instant_through_the_bulk_insert(repo, example_spec):
    from datetime import datetime, timedelta, timezone

    from api.views import ReportedMetric

    run = _running(repo, example_spec)
    keys = ["tab\tkey", "new\nline", "back\\slash", "quote's \"q\"", "ünï/cødé", r"\N"] * 200  # text COPY's escapes
    east = timezone(timedelta(hours=5))
    points = [ReportedMetric(step=i, key=key, value=i / 7, time=datetime(2026, 12, 1, 12, 0, tzinfo=east) if i % 2
                             else datetime(2026, 12, 1, 7, 0)) for i, key in enumerate(keys)]
    assert repo.add_metrics(run.id, points) == len(points)
    stored, _ = repo.metrics_after(run.id, after=0, limit=5000)
    assert [(p.step, p.key, p.value) for p in stored] == [(i, key, i / 7) for i, key in enumerate(keys)]
    assert [p.seq for p in stored] == sorted(p.seq for p in stored)
    assert {p.time for p in stored} == {datetime(2026, 12, 1, 7, 0, tzinfo=timezone.utc)}  # naive times are UTC
    assert repo.get_run(run.id).summary[r"\N"] == (len(keys) - 1) / 7


def test_the_bulk_insert_keeps_extreme_floats_and_the_largest_step_exactly(repo, example_spec):
    run = _running(repo, example_spec)
    values = [5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0, -1 / 3, 0.1 + 0.2, 1e22]
    points = [ReportedMetric(step=i, key="v", value=value, time=T0) for i, value in enumerate(values)]
    points.append(ReportedMetric(step=2**63 - 1, key="last", value=1.0, time=T0))
    repo.add_metrics(run.id, points)
    stored, _ = repo.metrics_after(run.id, after=0)
    assert [p.step for p in stored] == [p.step for p in points]
    bits = [struct.pack("d", p.value) for p in stored]
    expected = [struct.pack("d", p.value) for p in points]
    if repo.engine.dialect.name == "sqlite":  # SQLite stores -0.0 as 0.0 (PostgreSQL keeps the sign)
        expected[3] = struct.pack("d", 0.0)
    assert bits == expected


def test_summary_holds_the_latest_value_of_each_key(repo, example_spec):
    run = _running(repo, example_spec)
    repo.add_metrics(run.id, _points(("loss", 2.0), ("acc", 0.3)))
    repo.add_metrics(run.id, _points(("loss", 0.7)))
    assert repo.get_run(run.id).summary == {"loss": 0.7, "acc": 0.3}


def test_non_finite_values_are_left_out_of_metrics_and_summary(repo, example_spec):
    run = _running(repo, example_spec)
    stored = repo.add_metrics(run.id, _points(("loss", float("nan")), ("acc", 0.5), ("loss", float("inf"))))
    assert stored == 1
    assert [p.key for p in repo.metrics_after(run.id)[0]] == ["acc"]
    assert repo.get_run(run.id).summary == {"acc": 0.5}


def test_concurrent_completion_and_cancel_let_exactly_one_win(repo, example_spec):
    runs = [_running(repo, example_spec) for _ in range(6)]
    outcomes: list[str] = []

    def attempt(run_id: str, target: RunStatus, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            repo.transition(run_id, target)
            outcomes.append(f"{run_id}:{target.value}")
        except IllegalTransition:
            pass

    for run in runs:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=attempt, args=(run.id, target, barrier))
                   for target in (S.COMPLETED, S.CANCELING)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for run in runs:
        final = repo.get_run(run.id).status
        winners = [o for o in outcomes if o.startswith(f"{run.id}:")]
        # COMPLETED wins outright; CANCELING may win, and then COMPLETED is refused.
        assert winners == [f"{run.id}:{final.value}"]
        assert [e.to_status for e in repo.events(run.id)][-1] is final
        assert len(repo.events(run.id)) == 4


def test_a_ticks_snapshot_shows_the_spec_a_resume_rewrote_though_the_spec_is_read_once_per_attempt(repo, example_spec):
    run = _running(repo, example_spec)
    first = repo.snapshots([S.RUNNING])
    assert [(s.id, s.attempt, s.spec["parallelism"]["num_workers"]) for s in first] == [(run.id, 1, 2)]
    assert repo.snapshots([S.RUNNING])[0].spec is first[0].spec  # kept, not decoded again
    repo.transition(run.id, S.FAILED, error="lost")
    repo.resume_run(run.id, num_workers=1)  # a new attempt, on a rewritten spec
    again = repo.snapshots([S.QUEUED])
    assert [(s.id, s.attempt, s.spec["parallelism"]["num_workers"]) for s in again] == [(run.id, 2, 1)]
    assert repo.snapshots([S.RUNNING]) == []


def test_the_spec_cache_keeps_what_ticks_still_ask_for_and_drops_the_rest_within_two_turns():
    from service.attempt_store import SpecCache

    cache = SpecCache(turn=4)
    cache.put(("live", 1), {"a": 1})
    cache.put(("ended", 1), {"b": 2})
    for _ in range(12):  # three turns in which only the live run is asked for
        assert cache.get(("live", 1)) == {"a": 1}
    assert cache.get(("ended", 1)) is None
    assert len(cache.new) + len(cache.old) <= 2


def test_begin_attempts_starts_a_batch_in_queue_order_and_skips_what_moved_on(repo, example_spec):
    queued = [repo.create_run(example_spec) for _ in range(4)]
    canceled, requeued = queued[1], queued[2]
    repo.cancel_run(canceled.id)
    repo.begin_attempt(requeued.id, token="old")
    repo.transition(requeued.id, S.QUEUED)  # attempt 2 now: the snapshot of attempt 1 is stale
    order = [queued[3], canceled, requeued, queued[0]]
    tokens = {run.id: f"tok-{i}" for i, run in enumerate(order)}
    before = datetime.now(timezone.utc)
    started = repo.begin_attempts(order, tokens, lambda attempt: f"submitting run {attempt} to Ray")
    assert [run.id for run in started] == [queued[3].id, queued[0].id]
    for run in started:
        assert run.status is S.STARTING and run.ray_job_id == f"run-{run.id}-attempt-1"
        assert repo.check_token(run.id, tokens[run.id])
        assert repo.events(run.id)[-1].message == "submitting run 1 to Ray"
        # The attempt's start until its RUNNING says when training began: its submission.
        assert before <= repo.get_run(run.id).attempt_started_at <= datetime.now(timezone.utc)
    assert repo.get_run(canceled.id).status is S.CANCELING
    requeued = repo.get_run(requeued.id)
    assert (requeued.status, requeued.attempt, requeued.attempt_started_at) == (S.QUEUED, 2, None)


def test_begin_attempts_skips_a_run_another_writer_holds_instead_of_waiting_for_it(_postgres_engine, example_spec):
    from sqlalchemy import text

    from service.repository import Repository

    with _postgres_engine.begin() as conn:
        conn.execute(text("TRUNCATE metrics, run_events, runs, sweeps RESTART IDENTITY CASCADE"))
    repo = Repository(_postgres_engine)
    held, free = repo.create_run(example_spec), repo.create_run(example_spec)
    tokens = {held.id: "a", free.id: "b"}
    with repo.db.locked_write(Run, held.id, RunNotFound):  # a user's cancel, say, mid-transaction
        started = repo.begin_attempts([held, free], tokens, lambda attempt: "submitting")
    assert [run.id for run in started] == [free.id]
    assert repo.get_run(held.id).status is S.QUEUED  # the next tick starts it


def test_the_binary_copy_declares_each_metric_column_s_own_type(_postgres_engine):
    """Binary COPY converts nothing: a declared type that is not the column's (after a migration,
    say) fails only on PostgreSQL, with "insufficient data left in message"."""
    import re

    from sqlalchemy import text

    from service.metric_writes import _COPY_METRICS, _COPY_TYPES

    columns = re.search(r"\(([^)]*)\)", _COPY_METRICS).group(1).split(", ")
    with _postgres_engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT attname, format_type(atttypid, NULL) FROM pg_attribute "
                                        "WHERE attrelid = 'metrics'::regclass AND attnum > 0")).all())
    one_binary_form = {"text": {"text", "character varying"}, "int8": {"bigint"}, "float8": {"double precision"},
                       "timestamptz": {"timestamp with time zone"}, "int4": {"integer"}}
    assert len(columns) == len(_COPY_TYPES)
    assert {column: stored[column] for column in columns} == {
        column: stored[column] for column, declared in zip(columns, _COPY_TYPES)
        if stored[column] in one_binary_form[declared]}


def test_a_postgres_read_runs_each_statement_on_its_own_and_writes_stay_transactions(postgres_url):
    """Reads on PostgreSQL run in autocommit (no BEGIN/ROLLBACK round trips: service.db.session);
    the pooled connection they return still gives writes one transaction. ``pg_current_xact_id()``
    names the statement's transaction."""
    engine = make_engine(postgres_url)
    try:
        db, transaction = Database(engine), text("SELECT pg_current_xact_id()::text")
        with db.read() as session:  # a read that runs no statement takes no connection
            assert not session.in_transaction()
        assert engine.pool.checkedin() == 0
        for _ in range(3):
            with db.read() as session:
                first, second = (session.execute(transaction).scalar_one() for _ in range(2))
                assert first != second
            with db.write() as session:
                first, second = (session.execute(transaction).scalar_one() for _ in range(2))
                assert first == second
        assert engine.pool.checkedin() == 1  # one connection served every session, in turn
    finally:
        engine.dispose()


def test_writes_on_postgres_run_at_read_committed_whatever_the_servers_default(postgres_url):
    """Reads in autocommit see what a READ COMMITTED transaction's statements saw; the engine
    asks for that level, so a database whose default is stricter does not change it."""
    engine = make_engine(f"{postgres_url}?options=-c%20default_transaction_isolation%3Dserializable")
    try:
        with engine.connect() as conn:  # the option reached the server
            assert conn.exec_driver_sql("SHOW default_transaction_isolation").scalar_one() == "serializable"
        with Database(engine).write() as session:
            assert session.execute(text("SHOW transaction_isolation")).scalar_one() == "read committed"
    finally:
        engine.dispose()


def test_a_sqlite_read_sees_one_snapshot_for_all_its_statements(sqlite_repo, example_spec):
    """On SQLite a read keeps its BEGIN: a run written between two of its statements is not seen."""
    with sqlite_repo.db.read() as session:
        before = session.execute(select(func.count()).select_from(Run)).scalar_one()
        sqlite_repo.create_run(example_spec)  # another connection, committed
        assert session.execute(select(func.count()).select_from(Run)).scalar_one() == before
    assert _count(sqlite_repo, Run) == before + 1
