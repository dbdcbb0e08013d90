"""``bench/control_plane.py --quick`` runs end to end on PostgreSQL, and every request it sends succeeds.

Not timed (a 2-core machine shared with other jobs cannot hold a speed threshold): the smoke
test pins the report's shape, so the full run's JSON keeps the figures the closing notes of
issue 14 quote, and a route the dashboard polls that starts failing under load shows up here."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

from tests.conftest import PG_ADMIN_URL, REPO_ROOT

PHASES = ("submit", "ingest", "get_run", "list_runs", "get_run_16_clients", "list_runs_16_clients", "dashboard")
GOALS = {"submits_per_s", "get_run_p99_ms", "list_runs_p99_ms", "ingest_points_per_s", "tick_p99_ms",
         "dashboard_polls_per_s"}


def test_quick_control_plane_bench_measures_every_phase_and_every_request_succeeds(tmp_path):
    out = tmp_path / "control-plane.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "control_plane.py"), "--quick",
                           "--pg", PG_ADMIN_URL, "--out", str(out)],
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["all_requests_succeeded"] is True
    (size,) = report["sizes"].values()
    assert size["runs_stored"] >= report["settings"]["sizes"][0] + report["settings"]["active"]
    for name in PHASES:
        phase = size[name]
        requests = phase["requests"] if name == "dashboard" else phase
        assert requests["failed"] == 0 and requests["requests"] > 0, (name, requests)
    assert size["submit"]["requests"] == report["settings"]["submits"]
    assert size["submit"]["all_submitted_to_ray_after_s"] > 0
    sweep = size["sweep"]  # trials registered, run and completed while GET /runs/{id} is read
    assert sweep["trials_completed"] == sweep["trials"] == report["settings"]["sweep_trials"]
    assert sweep["driver"]["failed"] == 0 and sweep["driver"]["requests"] == 3 * sweep["trials"]
    assert sweep["get_run_during"]["failed"] == 0 and sweep["get_run_during"]["requests"] > 0
    assert sweep["get_run_p99_during_over_alone"] > 0
    ingest = size["ingest"]
    assert ingest["runs"] == 8
    assert ingest["points_stored"] == 8 * report["settings"]["ingest_reports"] * ingest["points_per_report"]
    dashboard = size["dashboard"]
    pages = report["settings"]["pages"]
    assert dashboard["pages"] == pages and dashboard["first_poll"]["n"] == pages
    assert dashboard["later_polls"]["n"] == pages * (report["settings"]["polls"] - 1)
    assert size["metric_points_stored"] == report["seeding"]["200"]["metric_points"] + ingest["points_stored"]
    tick = report["tick"]
    assert tick["active_runs"] == report["settings"]["active"]
    # One job list per tick and no other Ray call: no per-run status calls, and the log
    # archiver's copies are made on its own thread, at most copies_per_tick a pass however
    # many runs are live.
    from service.log_archive import LogArchiver

    copies_per_tick = inspect.signature(LogArchiver).parameters["copies_per_tick"].default
    assert tick["ray_calls_per_tick_by_method"] == {"states": 1.0}
    archiver = tick["archiver"]
    assert 1 <= archiver["passes"] <= report["settings"]["ticks"] and set(archiver["ray_calls_by_method"]) == {"job_logs"}
    assert 0 < archiver["ray_calls_by_method"]["job_logs"] <= copies_per_tick * archiver["passes"]
    assert copies_per_tick < tick["active_runs"]
    assert tick["ray_error"] is None
    assert set(report["goals"]) == GOALS
    assert all(goal["ratio"] > 0 and goal["measured"] > 0 for goal in report["goals"].values())
