"""workers.tune.actor_ranks without Ray: how a rank's ``on_eval`` turns Tune's stop into an
unwind of every rank (the broadcast is faked here; tests/workers/test_tune_sweep.py runs the
real thing on a Ray head), and how long joining a group waits for a peer that died."""

import pytest
import torch.distributed as dist

from workers.tune.actor_ranks import TrialStopped, _StopAtEval


def broadcasting(flag_value: int | None):
    """A stand-in for ``dist.broadcast``: what rank 0 would send (None: it sends what it has)."""
    def broadcast(tensor, src):
        assert src == 0
        if flag_value is not None:
            tensor.fill_(flag_value)
    return broadcast


def test_rank_0_reports_then_tells_the_peers_whether_tune_stopped_the_trial(monkeypatch):
    sent = []
    monkeypatch.setattr(dist, "broadcast", lambda tensor, src: sent.append(int(tensor.item())))
    reported = []
    _StopAtEval(reported.append)({"eval/accuracy": 0.5})
    assert reported == [{"eval/accuracy": 0.5}] and sent == [0]

    def stopped(results):
        raise SystemExit(0)  # what tune.report raises in a trial Tune stopped

    with pytest.raises(SystemExit):
        _StopAtEval(stopped)({})
    assert sent == [0, 1]


def test_a_peer_unwinds_on_the_stop_flag_and_trains_on_without_it(monkeypatch):
    monkeypatch.setattr(dist, "broadcast", broadcasting(0))
    _StopAtEval(None)({})
    monkeypatch.setattr(dist, "broadcast", broadcasting(1))
    with pytest.raises(TrialStopped):
        _StopAtEval(None)({})
    assert not issubclass(TrialStopped, Exception)  # no `except Exception` on the way catches it


def test_a_stop_stays_a_stop_when_the_broadcast_fails(monkeypatch):
    # A peer that died while rank 0 waited in tune.report: the trial is still stopped (never
    # trained again as a failure would be); without a stop the error is the rank's failure.
    def broken(tensor, src):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "broadcast", broken)

    def stopped(results):
        raise SystemExit(0)

    with pytest.raises(SystemExit):
        _StopAtEval(stopped)({})
    with pytest.raises(RuntimeError, match="closed by peer"):
        _StopAtEval(lambda results: None)({})


PEER_THAT_CONNECTS_AND_DIES = """
import datetime, os, sys
import torch.distributed as dist
dist.TCPStore(sys.argv[1], int(sys.argv[2]), 2, is_master=False, timeout=datetime.timedelta(seconds=60))
os._exit(1)  # connected to rank 0's store, gone before publishing its gloo address
"""
HEALTHY_PEER = """
import datetime, sys
import torch.distributed as dist
timeout = datetime.timedelta(seconds=60)
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), 2, is_master=False, timeout=timeout)
dist.init_process_group("gloo", store=store, rank=1, world_size=2, timeout=timeout)  # a fresh process's first group
dist.barrier()
dist.destroy_process_group()
"""


def test_joining_fails_within_the_join_timeout_when_a_peer_dies_after_connecting_and_the_next_join_works(
        monkeypatch):
    # Without Ray: rank 0 (this process) and one peer, a subprocess that connects to rank 0's
    # store and dies. init_process_group waits on the store for the timeout it is given; with
    # the group's own (here 60 s, 30 minutes in a sweep) rank 0 would wait for all of it. Then
    # rank 0 joins a new peer, as a trial's next try does.
    import subprocess
    import sys
    import time

    from workers.tune import actor_ranks

    monkeypatch.setattr(actor_ranks, "JOIN_TIMEOUT_S", 2)
    monkeypatch.setattr(actor_ranks, "GROUP_TIMEOUT_S", 60)
    host, port = "127.0.0.1", actor_ranks._store_address()[1]
    peer = subprocess.Popen([sys.executable, "-c", PEER_THAT_CONNECTS_AND_DIES, host, str(port)])
    try:
        started = time.monotonic()
        # Either timeout is the store's: waiting for the peer's address ("timeout"), or, when the
        # peer's Python starts slower than the join timeout on a loaded machine, for it to connect
        # ("Timed out ... waiting for clients"); both must come within the join timeout.
        with pytest.raises(dist.DistStoreError, match=r"(?i)time(d )?out"):
            actor_ranks._join(host, port, 0, 2)
        assert time.monotonic() - started < 30
        assert not dist.is_initialized()
    finally:
        peer.kill()
        peer.wait()
    port = actor_ranks._store_address()[1]
    peer = subprocess.Popen([sys.executable, "-c", HEALTHY_PEER, host, str(port)])
    try:
        monkeypatch.setattr(actor_ranks, "JOIN_TIMEOUT_S", 60)
        actor_ranks._join(host, port, 0, 2)  # the failed join left the group count as it was
        dist.barrier()
        assert dist.get_world_size() == 2
        dist.destroy_process_group()
        assert peer.wait(timeout=60) == 0
    finally:
        peer.kill()
        peer.wait()
