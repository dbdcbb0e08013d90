"""Training a sweep trial in its reused Tune actor, without Ray Train.

Tune reuses a trial actor for the next trial when their resources match (``reuse_actors``), so
what the actor keeps is already there for every trial after the first: imports, data sets, the
loader's fork server and, here, the ranks of a process group.

- **One worker** (strategy ``none``): the actor trains the one rank itself.
- **DDP or FSDP on CPUs**: the actor is rank 0, and ``num_workers - 1`` *peer* actors, placed in
  the other bundles of the trial's placement group (``space.trial_resources``), are the other
  ranks. The gloo process group is made by the first trial and kept (``_PeerGroup``): a later
  trial starts with no Train controller, no worker processes and no process group to make.

Either way ``spec.max_restarts`` is kept by training again, from the newest checkpoint, as Ray
Train would.

A group stays usable only if every rank leaves a trial at the same point:
- a trial that trains to its end: every rank returns from ``train_rank``;
- a trial Tune stops and then resets the actor for the next one (ASHA): rank 0 learns it in
  ``tune.report``, which it calls at an evaluation, where every rank calls ``on_eval``. After
  each report rank 0 broadcasts whether to stop, and on a stop every rank unwinds from there
  (``_StopAtEval``). (When Tune ends the actor instead, a canceled sweep or no trial left,
  the peers die with it: Ray ends an actor's actors with their owner.)
Anything else (a rank raises, a peer dies) can leave ranks waiting in a collective: the peers
are killed, which makes a gloo collective that rank 0 waits in fail at once ("Connection closed
by peer"), and the group is dropped; the next try or trial makes a new one. What a dead peer
does not make fail at once is a wait on the group's store (making a new group): joining waits
``JOIN_TIMEOUT_S`` at most, the checkpointer passes a barrier before making its own group
(``workers.checkpoint.manager``), and a kept group's peers are pinged before each trial.

GPU trials keep Ray Train's worker group (``space.trains_in_trial_actor``): on NCCL a rank whose
peer died waits in its collective until the watchdog's timeout instead of failing at once, and
this path has not run on a GPU.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

import ray
import torch

from api.specs import RunSpec
from workers.errors import TrainingError, describe

log = logging.getLogger("workers.tune")

GROUP_TIMEOUT_S = 1800  # a collective's timeout, as Ray Train's TorchConfig (rank 0 may wait in tune.report)
JOIN_TIMEOUT_S = 120    # peers start and join the process group
PING_TIMEOUT_S = 10     # a kept group's peers answer before a trial starts on them
PEERS_END_S = 30        # how long the peers may take to leave a trial after rank 0 has
PEERS_FAILED_END_S = 5  # the same after rank 0 failed: a failed peer is the likelier root cause


class TrialStopped(BaseException):
    """Tune stopped the trial: a peer rank unwinds at the evaluation where rank 0 learned it.
    Not an ``Exception``, so nothing on the way reports it as a failure."""


def train_in_actor(spec: RunSpec, config: dict[str, Any], report: Callable[[dict[str, float]], None]
                   ) -> dict[str, float]:
    """Train the trial here (one rank, or rank 0 of the peer group), up to ``1 +
    spec.max_restarts`` times (each later try resumes from the newest checkpoint and reports
    RESTARTING first); ``report(results)`` gets every evaluation (``tune.report``). Raises
    ``TrainingError`` with the last try's error."""
    restarts = 0
    while True:
        free_last_trainer(spec.parallelism.use_gpu)
        try:
            if spec.parallelism.strategy == "none":
                return _train_rank(config, 0, 1, on_eval=report) or {}
            return _train_with_peers(spec, config, report)
        except Exception as exc:
            if restarts == spec.max_restarts:
                raise TrainingError(describe(exc)) from exc
            restarts += 1
            log.warning("run %s failed, training it again (restart %d of %d): %s", config["run_id"],
                        restarts, spec.max_restarts, describe(exc))


def _train_rank(config: dict[str, Any], rank: int, world_size: int,
                on_eval: Callable[[dict[str, float]], None]) -> dict[str, float] | None:
    """``train_rank`` on this process's device, as every rank here trains."""
    from workers.parallel import device_for
    from workers.ray_train import train_rank

    return train_rank(config, rank=rank, world_size=world_size, device_for=device_for, on_eval=on_eval,
                      entered=time.time())


def free_last_trainer(gpu: bool) -> None:
    """Collect what an earlier trial (or try) in this process left in reference cycles, then
    freeze what survives (imports, Ray's and Tune's state), so that the next collection walks
    only the objects made since: a full collection of this process takes ~0.3 s, one after a
    freeze a few ms. Frozen objects are still freed by reference counting."""
    gc.collect()
    gc.freeze()
    if gpu:
        torch.cuda.empty_cache()


# --- DDP and FSDP: rank 0 here, the other ranks in peer actors ------------------------------

@dataclasses.dataclass
class _PeerGroup:
    """This trial actor's peers (ranks 1..) and the process group they share with it."""

    key: tuple[int, float]  # (world size, CPUs per worker): what a trial needs to reuse it
    peers: list[Any]        # actor handles, rank 1 first
    pids: list[int]         # the peers' processes, for the log


_GROUP: _PeerGroup | None = None  # kept across the trials this actor trains


def _train_with_peers(spec: RunSpec, config: dict[str, Any], report: Callable[[dict[str, float]], None]
                      ) -> dict[str, float]:
    """One try of the trial on the peer group (made first if there is none that fits); the
    group is kept only when rank 0 ended the trial (trained or stopped) and every peer did too."""
    group = _peer_group(spec)
    world = len(group.peers) + 1
    futures = [peer.train.remote(config, rank, world) for rank, peer in enumerate(group.peers, start=1)]
    watch = _PeerWatch(futures, group.peers)
    try:
        metrics = _train_rank(config, 0, world, on_eval=_StopAtEval(report)) or {}
    except Exception as exc:
        # Rank 0's trainer was not closed (its checkpointer's group, a write in flight), and
        # peers may wait in a collective: the group goes either way.
        watch.stop(wait_s=PEERS_FAILED_END_S)
        _tear_down()
        if watch.error is not None:  # the root cause; rank 0 only saw its peer go
            raise TrainingError(watch.error) from exc
        raise
    except BaseException:  # Tune's stop (SystemExit from tune.report), which every rank took
        watch.stop(wait_s=PEERS_END_S)
        _keep_if_peers_ended(futures)
        raise
    watch.stop(wait_s=PEERS_END_S)
    # Rank 0 has trained the run to its end (its final checkpoint was committed by every rank):
    # a peer that ends late or badly only costs the group.
    _keep_if_peers_ended(futures)
    return metrics


def _peer_group(spec: RunSpec) -> _PeerGroup:
    """The group this actor keeps, or a new one when it has none or one of another shape."""
    global _GROUP
    parallelism = spec.parallelism
    key = (parallelism.num_workers, parallelism.cpus_per_worker)
    if _GROUP is not None and _GROUP.key == key and _peers_answer(_GROUP):
        return _GROUP
    _tear_down()
    started = time.monotonic()
    placement = ray.util.get_current_placement_group()
    peers = [_peer_class().options(num_cpus=parallelism.cpus_per_worker,
                                   scheduling_strategy=_bundle(placement, rank)).remote()
             for rank in range(1, parallelism.num_workers)]
    host, port = _store_address()
    joins = [peer.join.remote(host, port, rank, parallelism.num_workers)
             for rank, peer in enumerate(peers, start=1)]
    try:
        _join(host, port, 0, parallelism.num_workers)  # waits JOIN_TIMEOUT_S at most for the peers
        pids = ray.get(joins, timeout=JOIN_TIMEOUT_S)
    except BaseException:
        _kill(peers)
        raise
    _GROUP = _PeerGroup(key=key, peers=peers, pids=pids)
    log.info("a process group of %d ranks (peers pid %s) in %.1f s, kept for this actor's next trials",
             parallelism.num_workers, pids, time.monotonic() - started)
    return _GROUP


def _peers_answer(group: _PeerGroup) -> bool:
    """Whether every kept peer is alive and idle (a peer that died between trials would
    otherwise be found only inside the next trial)."""
    try:
        ray.get([peer.ping.remote() for peer in group.peers], timeout=PING_TIMEOUT_S)
        return True
    except Exception as exc:
        log.warning("making a new process group: a kept peer did not answer: %s", describe(exc))
        return False


def _tear_down() -> None:
    """Kill the peers and drop this process's process groups."""
    global _GROUP
    import torch.distributed as dist

    if _GROUP is not None:
        _kill(_GROUP.peers)
        _GROUP = None
    if dist.is_initialized():
        dist.destroy_process_group()  # every group, the checkpointer's included


def _kill(peers: list[Any]) -> None:
    for peer in peers:
        ray.kill(peer)


def _keep_if_peers_ended(futures: list[Any]) -> None:
    """Keep the group if every peer has left the trial (trained or stopped); else drop it."""
    if not futures:  # a group of one: rank 0 alone
        return
    ready, _ = ray.wait(futures, num_returns=len(futures), timeout=0)
    try:
        if len(ready) < len(futures):
            raise TimeoutError(f"{len(futures) - len(ready)} peer rank(s) still in the trial")
        ray.get(futures)
    except Exception as exc:
        log.warning("dropping the process group: a peer rank did not end with rank 0: %s", describe(exc))
        _tear_down()


class _PeerWatch:
    """Watches the peers' ``train`` calls from a thread while rank 0 trains: when one fails,
    it keeps the error and kills the peers, so that rank 0's next (or current) collective
    fails instead of waiting for a rank that will never come."""

    def __init__(self, futures: list[Any], peers: list[Any]):
        self.error: str | None = None
        self._futures, self._peers = futures, peers
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tessera-peer-watch", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float) -> None:
        """Stop watching, after up to ``wait_s`` for every peer's call to end (or one to fail)."""
        self._thread.join(wait_s)
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        pending = list(self._futures)
        while pending and not self._done.is_set():
            ready, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            for ref in ready:
                try:
                    ray.get(ref)
                except Exception as exc:
                    self.error = describe(exc)
                    log.error("a peer rank failed, killing the peers: %s", self.error)
                    _kill(self._peers)
                    return


class _StopAtEval:
    """``on_eval`` of every rank: rank 0 (``report`` given) reports to Tune, then broadcasts
    whether Tune stopped the trial, and every rank unwinds at this same evaluation if it did."""

    def __init__(self, report: Callable[[dict[str, float]], None] | None):
        self.report = report

    def __call__(self, results: dict[str, float]) -> None:
        import torch.distributed as dist

        stopped: BaseException | None = None
        if self.report is not None:
            try:
                self.report(results)
            except BaseException as exc:  # SystemExit: Tune stopped the trial
                stopped = exc
        flag = torch.tensor([0 if stopped is None else 1])
        try:
            dist.broadcast(flag, src=0)
        except Exception:
            if stopped is not None:  # Tune's stop stands: a stopped trial is never trained again
                raise stopped from None
            raise
        if stopped is not None:
            raise stopped
        if flag.item():
            raise TrialStopped()


@functools.cache
def _peer_class() -> Any:
    """``_PeerRank`` as a Ray actor class (made on first use: this module is imported where Ray
    is not connected yet)."""
    return ray.remote(max_restarts=0)(_PeerRank)


class _PeerRank:
    """One peer rank: joins the process group once, then trains rank ``rank`` of each trial."""

    def join(self, host: str, port: int, rank: int, world_size: int) -> int:
        _join(host, port, rank, world_size)
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()

    def train(self, config: dict[str, Any], rank: int, world_size: int) -> str:
        free_last_trainer(False)
        try:
            _train_rank(config, rank, world_size, on_eval=_StopAtEval(None))
        except TrialStopped:
            return "stopped"
        return "trained"


def _join(host: str, port: int, rank: int, world_size: int) -> None:
    """Join the gloo process group whose store rank 0 serves at ``host:port``. Making the group
    waits twice, ``JOIN_TIMEOUT_S`` at most each time: for every rank to connect to the store,
    then for every rank's gloo address in it. (``init_process_group`` waits on the store for
    the timeout it is given: with the group's, a peer that connected and died before publishing
    its address would hold the others for 30 minutes; one that died after publishing it fails
    them at once, its connection refused.) Once joined, collectives and the store wait
    ``GROUP_TIMEOUT_S``."""
    import torch.distributed as dist

    joining = datetime.timedelta(seconds=JOIN_TIMEOUT_S)
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=joining)
    try:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=joining)
    except BaseException:
        # torch names a process's groups by a count ("0", "1", ...) that prefixes the group's
        # keys in the store; a failed init has taken a number, and only destroying a default
        # group resets the count. Left so, this actor's next group would be "1" where its new
        # peers' is "0", and the ranks would wait for each other's keys until the join timeout:
        # a trial whose first join failed could never join again. Reset as destroying would.
        if not dist.is_initialized():
            dist.distributed_c10d._world.group_count = 0
        raise
    joined = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    dist.set_timeout(joined)  # the group's collectives from now on
    store.set_timeout(joined)


def _store_address() -> tuple[str, int]:
    """This node's IP and a port free now, for rank 0's store (as Ray Train picks its master port)."""
    host = ray.util.get_node_ip_address()
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind(("", 0))
        return host, sock.getsockname()[1]


def _bundle(placement: Any, rank: int) -> Any:
    """Rank ``rank``'s bundle of the trial's placement group (bundle 0 is the trial actor's);
    none outside Tune (a test)."""
    if placement is None:
        return None
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=placement, placement_group_bundle_index=rank)
