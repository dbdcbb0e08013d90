"""Checkpoint reports, the checkpoint listing, resume, and attempts counted in one place."""

from __future__ import annotations

from datetime import datetime, timezone

from api.views import RunStatus

API = "/api/v1"


def _start(client, fake_jobs, body) -> tuple[dict, str]:
    run = client.post(f"{API}/runs", json=body).json()
    client.app.state.dispatcher.tick()
    token = fake_jobs.jobs[f"run-{run['id']}-attempt-1"]["env"]["TESSERA_RUN_TOKEN"]
    return run, token


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _checkpoint(step: int, *, committed: bool = True, error: str | None = None) -> dict:
    return {"step": step, "epoch": step // 10, "time": datetime.now(timezone.utc).isoformat(), "bytes": 1000 + step,
            "committed": committed, "url": f"s3://bucket/runs/r/checkpoints/ep{step // 10}-ba{step}",
            "world_size": 2, "error": error}


def test_committed_checkpoints_are_listed_and_the_oldest_dropped_beyond_keep_last(client, fake_jobs, example_body):
    example_body["checkpoint"] = {"interval": "5ba", "keep_last": 2}
    run, token = _start(client, fake_jobs, example_body)
    for step in (5, 10, 10, 15):  # the repeated report (a retry) updates its row
        response = client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=_checkpoint(step), headers=_auth(token))
        assert response.status_code == 200, response.text
        assert response.json()["committed"] is True and response.json()["attempt"] == 1
    listed = client.get(f"{API}/runs/{run['id']}/checkpoints").json()["data"]
    assert [(c["step"], c["committed"], c["bytes"]) for c in listed] == [(10, True, 1010), (15, True, 1015)]
    assert listed[-1]["url"].endswith("ep1-ba15") and listed[-1]["world_size"] == 2


def test_a_failed_save_is_listed_uncommitted_and_a_run_event_says_why(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    body = _checkpoint(20, committed=False, error="OSError: could not reach s3://bucket (connection refused)")
    assert client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=body, headers=_auth(token)).status_code == 200
    [listed] = client.get(f"{API}/runs/{run['id']}/checkpoints").json()["data"]
    assert listed["committed"] is False and "connection refused" in listed["error"]
    last = client.get(f"{API}/runs/{run['id']}/events").json()["data"][-1]
    assert "checkpoint at batch 20 not committed: OSError" in last["message"]
    assert client.get(f"{API}/runs/{run['id']}").json()["status"] == "STARTING"  # no status change


def test_checkpoint_reports_need_the_attempt_s_token(client, fake_jobs, example_body):
    run, _ = _start(client, fake_jobs, example_body)
    response = client.post(f"{API}/runs/{run['id']}/report/checkpoint", json=_checkpoint(5), headers=_auth("nope"))
    assert response.status_code == 401
    assert client.get(f"{API}/runs/unknown/checkpoints").status_code == 404


def test_a_worker_group_restart_counts_an_attempt_and_keeps_the_job_s_token(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    for status in ("RUNNING", "RESTARTING", "RUNNING"):
        response = client.post(f"{API}/runs/{run['id']}/report/status", json={"status": status}, headers=_auth(token))
        assert response.status_code == 200, response.text
    view = client.get(f"{API}/runs/{run['id']}").json()
    assert view["status"] == "RUNNING" and view["attempt"] == 2
    events = client.get(f"{API}/runs/{run['id']}/events").json()["data"]
    assert [(e["to_status"], e["attempt"]) for e in events][-3:] == [("RUNNING", 1), ("RESTARTING", 2), ("RUNNING", 2)]


def test_resume_requeues_a_failed_run_as_a_new_attempt_on_a_new_number_of_workers(client, fake_jobs, example_body):
    run, token = _start(client, fake_jobs, example_body)
    client.post(f"{API}/runs/{run['id']}/report/status", json={"status": "FAILED", "error": "boom"}, headers=_auth(token))
    resumed = client.post(f"{API}/runs/{run['id']}/resume", json={"num_workers": 4})
    assert resumed.status_code == 200, resumed.text
    body = resumed.json()
    assert (body["status"], body["attempt"], body["error"]) == ("QUEUED", 2, None)
    assert body["spec"]["parallelism"]["num_workers"] == 4
    client.app.state.dispatcher.tick()
    assert f"run-{run['id']}-attempt-2" in fake_jobs.jobs
    # The old attempt's token no longer reports.
    stale = client.post(f"{API}/runs/{run['id']}/report/status", json={"status": "RUNNING"}, headers=_auth(token))
    assert stale.status_code == 401


def test_resume_of_a_run_that_has_not_ended_badly_is_a_conflict(client, fake_jobs, example_body):
    run, _ = _start(client, fake_jobs, example_body)
    response = client.post(f"{API}/runs/{run['id']}/resume")
    assert response.status_code == 409
    assert response.json()["detail"] == (f"run {run['id']} is STARTING; only FAILED, CANCELED or STOPPED runs "
                                         "can be resumed")


def test_resume_with_a_number_of_workers_that_breaks_the_spec_is_refused(client, fake_jobs, example_body):
    run, _ = _start(client, fake_jobs, example_body)
    client.post(f"{API}/runs/{run['id']}/cancel")
    client.app.state.dispatcher.tick()
    assert client.get(f"{API}/runs/{run['id']}").json()["status"] == "CANCELED"
    response = client.post(f"{API}/runs/{run['id']}/resume", json={"num_workers": 3})
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["field"] == "num_workers" and error["input"] == 3 and "divisible" in error["msg"]
    assert client.get(f"{API}/runs/{run['id']}").json()["status"] == "CANCELED"
    assert client.post(f"{API}/runs/{run['id']}/resume", json={"num_workers": 1}).json()["status"] == RunStatus.QUEUED.value
