"""The admission queue: the pure plan, and the dispatcher admitting runs through it with a fake
cluster of known size (the real-Ray version is tests/e2e/test_queue.py)."""

from __future__ import annotations

import time

import pytest

from api.views import RunStatus
from service.admission import Candidate, Capacity, Demand, Quota, plan, queue_order
from tests.conftest import ADMIN_HEADERS

API = "/api/v1"
TWO = Demand(cpus=2, gpus=0, workers=2)


def _c(run_id: str, project: str = "a", priority: str = "normal", demand: Demand = TWO) -> Candidate:
    return Candidate(id=run_id, project=project, priority=priority, demand=demand)


def test_only_what_the_cluster_holds_is_admitted_and_the_rest_wait_for_resources_or_their_turn():
    queued = [_c(f"r{i}") for i in range(6)]
    decided = plan(queued, [], Capacity(cpus=4, gpus=0), {})
    assert decided.admit == ["r0", "r1"]
    assert [(decided.waiting[f"r{i}"].position, decided.waiting[f"r{i}"].reason) for i in range(2, 6)] == [
        (1, "resources"), (2, "resources"), (3, "resources"), (4, "resources")]
    running = [_c("r0"), _c("r1")]
    assert plan(queued[2:], running, Capacity(4, 0), {}).admit == []
    assert plan(queued[2:], running[:1], Capacity(4, 0), {}).admit == ["r2"]


def test_higher_priority_goes_first_and_equal_priority_takes_turns_across_projects():
    queued = [_c("a1", "a"), _c("a2", "a"), _c("a3", "a"), _c("b1", "b"), _c("low", "b", "low"),
              _c("high", "c", "high")]
    assert [c.id for c in queue_order(queued, {})] == ["high", "a1", "b1", "a2", "a3", "low"]
    # a project that already runs more goes after one that runs less
    assert [c.id for c in queue_order(queued, {"a": 3})][:3] == ["high", "b1", "a1"]


def test_a_small_run_does_not_jump_a_bigger_one_of_higher_priority():
    big = _c("big", priority="high", demand=Demand(cpus=4, gpus=0, workers=4))
    decided = plan([big, _c("small")], [_c("running", demand=Demand(2, 0, 2))], Capacity(4, 0), {})
    assert decided.admit == []
    assert decided.waiting["big"].reason == "resources" and decided.waiting["small"].reason == "priority"


def test_quotas_hold_back_their_project_only():
    quotas = {"a": Quota(max_running_runs=1)}
    decided = plan([_c("a1", "a"), _c("a2", "a"), _c("b1", "b")], [], Capacity(100, 0), quotas)
    assert decided.admit == ["a1", "b1"] and decided.waiting["a2"].reason == "quota"
    assert "max_running_runs=1" in decided.waiting["a2"].detail
    workers = plan([_c("a1", "a")], [_c("x", "a")], Capacity(100, 0), {"a": Quota(max_workers=3)})
    assert workers.waiting["a1"].reason == "quota" and "max_workers=3" in workers.waiting["a1"].detail
    gpus = plan([_c("g", "a", demand=Demand(2, 2, 2))], [], Capacity(100, 8), {"a": Quota(max_gpus=1)})
    assert gpus.waiting["g"].reason == "quota"


def _sweep_c(sweep_id: str, project: str = "a", demand: Demand = TWO) -> Candidate:
    """A sweep: queued with one trial's demand, or active (``Demand(0, 0, 0)``: its trials hold the cluster)."""
    return Candidate(id=sweep_id, project=project, priority="normal", demand=demand, sweep_id=sweep_id)


def _trial_c(run_id: str, sweep_id: str, project: str = "a") -> Candidate:
    return Candidate(id=run_id, project=project, priority="normal", demand=TWO, sweep_id=sweep_id)


NOTHING = Demand(cpus=0, gpus=0, workers=0)


def test_an_active_sweep_is_one_run_of_max_running_runs_before_and_after_its_trials_exist():
    one = {"a": Quota(max_running_runs=1)}
    # Admitted, no trial registered yet: the project's plain runs wait for it.
    started = plan([_c("r1"), _c("b1", "b")], [_sweep_c("s", demand=NOTHING)], Capacity(100, 0), one)
    assert started.admit == ["b1"] and started.waiting["r1"].reason == "quota"
    assert started.waiting["r1"].detail == ("the project runs 1 of max_running_runs=1 "
                                            "(one of them sweep s, which counts as one run with all its trials)")
    # Its trials count under it, never as runs of their own: two trials and the sweep are one run.
    training = [_sweep_c("s", demand=NOTHING), _trial_c("t1", "s"), _trial_c("t2", "s")]
    assert plan([_c("r1")], training, Capacity(100, 0), one).waiting["r1"].reason == "quota"
    assert plan([_c("r1")], training, Capacity(100, 0), {"a": Quota(max_running_runs=2)}).admit == ["r1"]
    # ... a trial read before its sweep (the sweeps are read after the runs) is still that one run
    assert plan([_c("r1")], training[1:], Capacity(100, 0), {"a": Quota(max_running_runs=2)}).admit == ["r1"]


def test_a_sweep_waits_for_a_running_run_and_a_run_for_a_sweep_admitted_in_the_same_plan():
    one = {"a": Quota(max_running_runs=1)}
    held = plan([_sweep_c("s")], [_c("r0")], Capacity(100, 0), one)
    assert held.admit == [] and held.waiting["s"].reason == "quota"
    assert held.waiting["s"].detail == "the project runs 1 of max_running_runs=1"
    both = plan([_sweep_c("s"), _c("r1")], [], Capacity(100, 0), one)
    assert both.admit == ["s"] and both.waiting["r1"].reason == "quota"
    # A sweep re-queued with trials that outlived its last driver: they are its own run already.
    assert plan([_sweep_c("s")], [_trial_c("t1", "s")], Capacity(100, 0), one).admit == ["s"]


def test_a_sweeps_trials_hold_the_cluster_and_the_worker_and_gpu_quotas_like_any_run():
    training = [_sweep_c("s", demand=NOTHING), _trial_c("t1", "s"), _trial_c("t2", "s")]  # 2 x 2 CPUs, 2 workers
    full = plan([_c("r1")], training, Capacity(4, 0), {})
    assert full.admit == [] and full.waiting["r1"].reason == "resources"
    workers = plan([_c("r1")], training, Capacity(100, 0), {"a": Quota(max_workers=5)})
    assert workers.waiting["r1"].reason == "quota" and "hold 4 of max_workers=5" in workers.waiting["r1"].detail
    gpu_trials = [_sweep_c("s", demand=NOTHING),
                  Candidate("t1", "a", "normal", Demand(1, 1, 1), sweep_id="s")]
    gpus = plan([_c("g", demand=Demand(1, 1, 1))], gpu_trials, Capacity(100, 8), {"a": Quota(max_gpus=1)})
    assert gpus.waiting["g"].reason == "quota" and "max_gpus=1" in gpus.waiting["g"].detail


def test_a_run_bigger_than_a_shrunken_cluster_waits_with_that_reason_and_blocks_nobody():
    huge = _c("huge", priority="high", demand=Demand(cpus=64, gpus=0, workers=64))
    decided = plan([huge, _c("r1")], [], Capacity(4, 0), {})
    assert decided.admit == ["r1"]
    assert decided.waiting["huge"].reason == "resources" and "the cluster has 4" in decided.waiting["huge"].detail


def test_demand_is_workers_times_cpus_per_worker_and_one_gpu_per_worker():
    assert Demand.of({"parallelism": {"num_workers": 3, "cpus_per_worker": 2}}) == Demand(6, 0, 3)
    assert Demand.of({"parallelism": {"num_workers": 2, "use_gpu": True}}) == Demand(2, 2, 2)


# --- the dispatcher with a fake cluster ----------------------------------------------------

class SizedJobs:
    """The fake Jobs client plus a cluster size, and ``states`` (one list per tick)."""

    def __init__(self, fake_jobs, cpus: float, gpus: float = 0):
        self.fake, self.cpus, self.gpus = fake_jobs, cpus, gpus
        self.list_calls = 0
        self.status_calls = 0

    def cluster_capacity(self):
        return self.cpus, self.gpus

    def states(self):
        self.list_calls += 1
        return {job_id: job["status"] for job_id, job in self.fake.jobs.items()}

    def status(self, job_id):
        self.status_calls += 1
        return self.fake.status(job_id)

    def __getattr__(self, name):
        return getattr(self.fake, name)


@pytest.fixture
def sized(settings, fake_jobs):
    from fastapi.testclient import TestClient

    from service.app import create_app

    jobs = SizedJobs(fake_jobs, cpus=4)
    with TestClient(create_app(settings, jobs=jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        yield client, jobs


def _submit(client, body, **params):
    response = client.post(f"{API}/runs", json=body, params=params)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_the_dispatcher_admits_by_priority_and_shows_each_waiting_run_its_place(sized, example_body):
    client, jobs = sized
    dispatcher = client.app.state.dispatcher
    ids = [_submit(client, {**example_body, "name": f"r{i}"}) for i in range(4)]
    urgent = _submit(client, {**example_body, "name": "urgent", "priority": "high"})
    dispatcher.tick()
    statuses = {run_id: client.get(f"{API}/runs/{run_id}").json() for run_id in [*ids, urgent]}
    assert statuses[urgent]["status"] == "STARTING" and statuses[ids[0]]["status"] == "STARTING"
    waiting = [statuses[run_id] for run_id in ids[1:]]
    assert [(r["status"], r["queue"]["position"], r["queue"]["reason"]) for r in waiting] == [
        ("QUEUED", 1, "resources"), ("QUEUED", 2, "resources"), ("QUEUED", 3, "resources")]
    listed = {r["id"]: r["queue"] for r in client.get(f"{API}/runs").json()["data"]}
    assert listed[ids[1]]["position"] == 1 and listed[urgent] is None
    # Following reads every job's state in one call per tick (its first), not one per active run.
    jobs.status_calls = jobs.list_calls = 0
    dispatcher.tick()
    assert jobs.list_calls == 1 and jobs.status_calls == 0


def test_a_process_that_does_not_dispatch_plans_the_queue_only_when_an_answer_reads_the_plan(
        sized, example_body, monkeypatch):
    from service import dispatcher as dispatcher_module
    from service.admission import Admission

    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    monkeypatch.setattr(dispatcher_module, "FOLLOWER_PLAN_S", 3600.0)  # no plan goes stale by itself
    ids = [_submit(client, example_body) for _ in range(3)]
    dispatcher.tick()  # two fit the cluster; the third waits
    dispatcher.leading = False  # from here on, a process that does not hold the dispatch lease
    plans = []
    real_plan = Admission.__call__
    monkeypatch.setattr(Admission, "__call__", lambda self, *a, **k: plans.append(1) or real_plan(self, *a, **k))

    def place(run_id):
        return (client.get(f"{API}/runs/{run_id}").json().get("queue") or {}).get("position")

    later = _submit(client, example_body)
    assert (place(ids[2]), place(later)) == (1, None)  # the tick's plan: fresh, so no plan of its own
    monkeypatch.setattr(dispatcher_module, "FOLLOWER_PLAN_S", 0.0)  # every plan is stale now
    dispatcher._plan_read = False
    dispatcher._plan_queue(time.monotonic())  # its thread, with no answer read since: no plan
    assert plans == []
    dispatcher._plan_read = True
    dispatcher._plan_queue(time.monotonic())  # an answer read the plan: the thread plans
    assert plans == [1] and dispatcher.admission.waiting[later].position == 2
    assert place(ids[2]) == 1 and plans == [1, 1]  # a stale plan: planned on the request that read it

    def broken(self, *args, **kwargs):
        raise OSError("the database is away")

    monkeypatch.setattr(Admission, "__call__", broken)
    assert place(ids[2]) is None  # a failed plan shows no place rather than an old one


def test_the_dispatching_process_shows_no_plan_older_than_its_ticks_make_them(sized, example_body, monkeypatch):
    from service import dispatcher as dispatcher_module

    client, _jobs = sized
    ids = [_submit(client, example_body) for _ in range(3)]
    client.app.state.dispatcher.tick()
    assert client.get(f"{API}/runs/{ids[2]}").json()["queue"]["position"] == 1
    monkeypatch.setattr(dispatcher_module, "LEADER_PLAN_SHOWN_S", 0.0)  # as if no tick had planned since
    assert client.get(f"{API}/runs/{ids[2]}").json()["queue"] is None


def test_a_run_that_can_never_fit_is_refused_at_submit_unless_an_autoscaler_is_configured(sized, example_body):
    client, _jobs = sized
    client.app.state.dispatcher.tick()  # the dispatcher has read the cluster's size
    body = {**example_body, "parallelism": {"strategy": "ddp", "num_workers": 8}}
    response = client.post(f"{API}/runs", json=body)
    assert response.status_code == 422
    detail = response.json()["detail"][0]
    assert detail["field"] == "parallelism.num_workers" and "the cluster has 4" in detail["msg"]
    client.app.state.dispatcher.admission.autoscaler = True
    grows = client.post(f"{API}/runs", json=body)
    assert grows.status_code == 201
    # ...and it is handed to Ray at once, whose autoscaler adds the nodes it asks for: held back
    # until it fit, it would ask Ray for nothing and the cluster would never grow.
    client.app.state.dispatcher.tick()
    assert client.get(f"{API}/runs/{grows.json()['id']}").json()["status"] == "STARTING"


def test_an_autoscaling_cluster_grows_for_one_run_at_a_time_in_the_queues_order_within_quotas():
    big, small = Demand(cpus=8, gpus=1, workers=1), Demand(cpus=1, gpus=0, workers=1)
    queued = [Candidate("big", "a", "normal", big), Candidate("big-2", "a", "normal", big),
              Candidate("small", "a", "normal", small), Candidate("capped", "b", "high", big)]
    decided = plan(queued, [], Capacity(cpus=4, gpus=0), {"b": Quota(max_gpus=0)}, grow=True)
    assert decided.admit == ["big"]  # asked of Ray although it does not fit: the autoscaler adds its node
    assert {run_id: info.reason for run_id, info in decided.waiting.items()} == {
        "big-2": "resources", "small": "resources", "capped": "quota"}
    assert decided.waiting["small"].detail == "the cluster grows for a run ahead of it"
    # The next tick, "big" is active and still waits for its node: nothing more is asked of Ray.
    later = plan(queued[1:], [queued[0]], Capacity(cpus=4, gpus=0), {"b": Quota(max_gpus=0)}, grow=True)
    assert later.admit == [] and later.waiting["big-2"].detail == "the cluster grows for a run ahead of it"
    # Once its node is up the cluster holds it, and the next one grows it again.
    grown = plan(queued[1:], [queued[0]], Capacity(cpus=12, gpus=1), {"b": Quota(max_gpus=0)}, grow=True)
    assert grown.admit == ["big-2"]
    # Without an autoscaler the big ones wait for a cluster that cannot hold them, and block no one.
    fixed = plan(queued, [], Capacity(cpus=4, gpus=0), {"b": Quota(max_gpus=0)})
    assert fixed.admit == ["small"] and fixed.waiting["big"].reason == "resources"


def test_a_project_quota_set_by_its_admin_holds_its_runs_back(sized, example_body):
    client, _jobs = sized
    assert client.put(f"{API}/projects/default/quota", json={"max_running_runs": 1}).status_code == 200
    first, second = _submit(client, example_body), _submit(client, example_body)
    client.app.state.dispatcher.tick()
    assert client.get(f"{API}/runs/{first}").json()["status"] == "STARTING"
    queued = client.get(f"{API}/runs/{second}").json()
    assert queued["status"] == "QUEUED" and queued["queue"]["reason"] == "quota"


# --- wall-clock limits ---------------------------------------------------------------------

def test_a_run_past_its_wall_clock_limit_is_stopped_and_fails_with_that_reason(client, fake_jobs, example_body):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import update

    from service.db.models import RunEvent

    run_id = _submit(client, {**example_body, "max_wall_time": "30m"})
    other = _submit(client, example_body)  # no limit: left alone
    dispatcher = client.app.state.dispatcher
    dispatcher.tick()
    dispatcher.tick()
    assert client.get(f"{API}/runs/{run_id}").json()["status"] == "STARTING"  # within its 30 minutes
    with client.app.state.repo.engine.begin() as conn:  # the attempt started 31 minutes ago
        conn.execute(update(RunEvent).where(RunEvent.run_id.in_([run_id, other]))
                     .values(time=datetime.now(timezone.utc) - timedelta(minutes=31)))
    dispatcher.tick()
    failed = client.get(f"{API}/runs/{run_id}").json()
    assert failed["status"] == "FAILED" and "max_wall_time 1800s exceeded" in failed["error"]
    assert f"run-{run_id}-attempt-1" in fake_jobs.stop_calls
    assert client.get(f"{API}/runs/{other}").json()["status"] == "STARTING"


def test_max_wall_time_is_capped_by_the_service_and_a_project_cap_raises_it(tmp_path, fake_jobs, example_body):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", max_wall_time_s=3600, public_url="http://tessera.test:8000")
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        refused = client.post(f"{API}/runs", json={**example_body, "max_wall_time": "2h"})
        assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "max_wall_time"
        assert client.post(f"{API}/runs", json={**example_body, "max_wall_time": "1h"}).status_code == 201
        assert client.put(f"{API}/projects/default/quota", json={"max_wall_time_cap_s": 86400}).status_code == 200
        assert client.post(f"{API}/runs", json={**example_body, "max_wall_time": "2h"}).status_code == 201


def test_max_duration_is_capped_per_unit_and_an_every_project_admin_raises_it(tmp_path, fake_jobs, example_body):
    """The service's caps refuse a typo'd duration on runs and sweeps (base and searched values);
    a project admin cannot raise them, an admin of every project can, and a project admin can
    send the raised value back unchanged when setting other quotas."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(home=tmp_path / "home", max_duration_caps={"ep": 50}, public_url="http://tessera.test:8000")
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False), headers=ADMIN_HEADERS) as client:
        refused = client.post(f"{API}/runs", json={**example_body, "max_duration": "51ep"})
        assert refused.status_code == 422
        [item] = refused.json()["detail"]
        assert item["field"] == "max_duration" and item["input"] == "51ep" and "at most 50ep" in item["msg"]
        run_id = client.post(f"{API}/runs", json={**example_body, "max_duration": "50ep"}).json()["id"]
        # forks and continues are capped as well
        forked = client.post(f"{API}/runs/{run_id}/fork", json={"from": "scratch", "patch": {"max_duration": "51ep"}})
        assert forked.status_code == 422 and forked.json()["detail"][0]["loc"] == ["body", "patch", "max_duration"]
        continued = client.post(f"{API}/runs/{run_id}/continue", json={"max_duration": "60ep"})
        assert continued.status_code == 422 and "at most 50ep" in continued.json()["detail"][0]["msg"]
        # another unit keeps the service's default
        assert client.post(f"{API}/runs", json={**example_body, "max_duration": "100000001ba"}).status_code == 422

        sweep = {"name": "capped", "base": {**example_body, "max_duration": "2ep"}, "metric": "eval/accuracy", "mode": "max",
                 "search": {"params": {"max_duration": {"choice": ["3ep", "80ep"]}}}}
        refused = client.post(f"{API}/sweeps", json=sweep)
        assert refused.status_code == 422, refused.text
        assert [(i["field"], i["input"]) for i in refused.json()["detail"]] == [
            ("search.params.max_duration.choice", "80ep")]

        client.post(f"{API}/projects", json={"name": "vision"})
        key = client.post(f"{API}/keys", json={"project": "vision", "role": "admin", "name": "lead"}).json()["key"]
        lead = {"Authorization": f"Bearer {key}"}
        assert client.put(f"{API}/projects/vision/quota", json={"max_duration_caps": {"ep": 500}},
                          headers=lead).status_code == 403
        assert client.put(f"{API}/projects/vision/quota", json={"max_duration_caps": {"ep": 500}}).status_code == 200
        assert client.put(f"{API}/projects/vision/quota", json={"max_duration_caps": {"ep": 500}, "max_running_runs": 2},
                          headers=lead).status_code == 200
        assert client.post(f"{API}/runs?project=vision", json={**example_body, "max_duration": "80ep"},
                           headers=lead).status_code == 201
        bad_unit = client.put(f"{API}/projects/vision/quota", json={"max_duration_caps": {"dur": 1}})
        assert bad_unit.status_code == 422 and "max_duration_caps" in bad_unit.text


def test_a_sweep_waits_in_the_same_queue_as_runs_and_starts_when_its_first_trial_fits(sized, example_body):
    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    runs = [_submit(client, {**example_body, "name": f"r{i}"}) for i in range(2)]  # 2 x 2 CPUs: the cluster is full
    sweep = client.post(f"{API}/sweeps", json={"name": "s", "base": example_body, "metric": "eval/accuracy",
                                               "mode": "max", "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}})
    assert sweep.status_code == 201, sweep.text
    sweep_id = sweep.json()["id"]
    dispatcher.tick()
    waiting = client.get(f"{API}/sweeps/{sweep_id}").json()
    assert waiting["status"] == "QUEUED" and waiting["queue"]["reason"] == "resources"
    assert waiting["queue"]["position"] == 1 and "needs 2 CPUs" in waiting["queue"]["detail"]

    assert client.post(f"{API}/runs/{runs[0]}/cancel").status_code == 200
    dispatcher.tick()  # the canceled run's job is stopped and its CPUs are free
    dispatcher.tick()
    started = client.get(f"{API}/sweeps/{sweep_id}").json()
    assert started["status"] == "STARTING" and started["queue"] is None

    assert client.put(f"{API}/projects/default/quota", json={"max_running_runs": 1}).status_code == 200
    held = client.post(f"{API}/sweeps", json={"name": "s2", "base": example_body, "metric": "eval/accuracy",
                                              "mode": "max", "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}})
    dispatcher.tick()
    assert client.get(f"{API}/sweeps/{held.json()['id']}").json()["queue"]["reason"] == "quota"


def test_a_sweep_is_checked_at_submit_as_a_run_is(sized, example_body):
    """Its base names a code package the project lacks and asks for more workers than the
    cluster holds: both refused at once, with the base's field paths."""
    client, _jobs = sized
    client.app.state.dispatcher.tick()  # the dispatcher has read the cluster's size
    base = {**example_body, "code": {"digest": "0" * 64},
            "parallelism": {"strategy": "ddp", "num_workers": 8}}
    refused = client.post(f"{API}/sweeps", json={"name": "s", "base": base, "metric": "eval/accuracy", "mode": "max",
                                                 "search": {"params": {"optimizer.lr": {"grid": [0.1]}}}})
    assert refused.status_code == 422, refused.text
    assert sorted(item["field"] for item in refused.json()["detail"]) == ["base.code.digest",
                                                                        "base.parallelism.num_workers"]


def _vision(client, **quota) -> None:
    """Project ``vision`` with ``quota``, as the user's report had it."""
    assert client.post(f"{API}/projects", json={"name": "vision"}).status_code == 201
    assert client.put(f"{API}/projects/vision/quota", json=quota).status_code == 200


def _submit_sweep(client, body, project="vision") -> str:
    sweep = client.post(f"{API}/sweeps", params={"project": project},
                        json={"name": "s", "base": body, "metric": "eval/accuracy", "mode": "max",
                              "search": {"params": {"optimizer.lr": {"grid": [0.1, 0.2]}}}})
    assert sweep.status_code == 201, sweep.text
    return sweep.json()["id"]


def test_a_started_sweep_without_trials_yet_holds_its_projects_only_run(sized, example_body, example_spec):
    """The report: max_running_runs=1, a sweep, and 2 s later a plain run: both were admitted,
    and the plain run trained beside the sweep's trials once they came."""
    from api.views import SweepStatus

    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    _vision(client, max_running_runs=1)
    sweep_id = _submit_sweep(client, example_body)
    dispatcher.tick()
    assert client.get(f"{API}/sweeps/{sweep_id}").json()["status"] == "STARTING"
    assert client.get(f"{API}/runs", params={"sweep_id": sweep_id}).json()["data"] == []  # no trial yet
    run_id = _submit(client, example_body, project="vision")
    dispatcher.tick()
    waiting = client.get(f"{API}/runs/{run_id}").json()
    assert waiting["status"] == "QUEUED" and waiting["queue"]["reason"] == "quota", waiting
    assert waiting["queue"]["detail"].startswith(f"the project runs 1 of max_running_runs=1 (one of them sweep {sweep_id},")
    # Its driver's trials are that same one run: the plain run waits on, for the sweep, not for them.
    for trial in ("t1", "t2"):
        dispatcher.sweeps.register_trial(sweep_id, trial_id=trial, spec=example_spec, params={}, token=trial)
    dispatcher.tick()
    assert client.get(f"{API}/runs/{run_id}").json()["queue"]["detail"].startswith("the project runs 1 of")
    dispatcher.sweeps.apply_driver_report(sweep_id, SweepStatus.COMPLETED)  # its trials end with it
    dispatcher.tick()
    assert client.get(f"{API}/runs/{run_id}").json()["status"] == "STARTING"


def test_a_started_sweep_keeps_the_room_of_its_first_trial_until_that_trial_holds_it(sized, example_body,
                                                                                      example_spec):
    """A 4-CPU cluster, a sweep of 2-CPU trials admitted: before its driver registers a trial,
    another project's runs may take the other 2 CPUs only, not the sweep's."""
    from api.views import SweepStatus

    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    _vision(client)
    sweep_id = _submit_sweep(client, example_body)
    dispatcher.tick()
    assert client.get(f"{API}/sweeps/{sweep_id}").json()["status"] == "STARTING"
    runs = [_submit(client, {**example_body, "name": f"r{i}"}) for i in range(2)]
    dispatcher.tick()
    first, second = (client.get(f"{API}/runs/{run_id}").json() for run_id in runs)
    assert first["status"] == "STARTING"
    assert second["status"] == "QUEUED" and second["queue"]["reason"] == "resources", second
    assert second["queue"]["detail"] == "needs 2 CPUs and 0 GPUs; free: 0 CPUs, 0 GPUs"
    # Its trial now holds what the sweep held, not as much again.
    dispatcher.sweeps.register_trial(sweep_id, trial_id="t1", spec=example_spec, params={}, token="t1")
    dispatcher.tick()
    assert client.get(f"{API}/runs/{runs[1]}").json()["queue"]["detail"].endswith("free: 0 CPUs, 0 GPUs")
    dispatcher.sweeps.apply_driver_report(sweep_id, SweepStatus.COMPLETED)  # its trial ends with it
    dispatcher.tick()
    assert client.get(f"{API}/runs/{runs[1]}").json()["status"] == "STARTING"


def test_a_running_plain_run_holds_its_projects_only_run_against_a_queued_sweep(sized, example_body):
    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    _vision(client, max_running_runs=1)
    run_id = _submit(client, example_body, project="vision")
    dispatcher.tick()
    assert client.get(f"{API}/runs/{run_id}").json()["status"] == "STARTING"
    sweep_id = _submit_sweep(client, example_body)
    dispatcher.tick()
    waiting = client.get(f"{API}/sweeps/{sweep_id}").json()
    assert waiting["status"] == "QUEUED" and waiting["queue"] == {
        "position": 1, "reason": "quota", "detail": "the project runs 1 of max_running_runs=1"}
    assert client.post(f"{API}/runs/{run_id}/cancel").status_code == 200
    dispatcher.tick()  # the canceled run's job is stopped
    dispatcher.tick()
    assert client.get(f"{API}/sweeps/{sweep_id}").json()["status"] == "STARTING"


def test_an_external_sweep_holds_its_projects_run_only_while_its_trials_train(sized, example_body, example_spec):
    """An external sweep is RUNNING from its creation and no job of the service's follows it: its
    notebook may have died. It holds max_running_runs through its active trials, never alone."""
    client, _jobs = sized
    dispatcher = client.app.state.dispatcher
    _vision(client, max_running_runs=1)
    external = client.post(f"{API}/sweeps", params={"project": "vision", "driver": "external"},
                           json={"name": "nb", "base": example_body,
                                 "search": {"params": {"optimizer.lr": {"grid": [0.1, 0.2]}}}})
    assert external.status_code == 201, external.text
    sweep_id = external.json()["id"]
    trial = dispatcher.sweeps.register_trial(sweep_id, trial_id="t1", spec=example_spec, params={}, token="t1")
    run_id = _submit(client, example_body, project="vision")
    dispatcher.tick()
    waiting = client.get(f"{API}/runs/{run_id}").json()
    assert waiting["status"] == "QUEUED" and waiting["queue"]["reason"] == "quota", waiting
    dispatcher.repo.transition(trial.id, RunStatus.RUNNING)
    dispatcher.repo.transition(trial.id, RunStatus.COMPLETED)  # its notebook then dies: the sweep stays RUNNING
    dispatcher.tick()
    assert client.get(f"{API}/runs/{run_id}").json()["status"] == "STARTING"
