"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): save, commit, retain, load.

Layout under ``{storage}/runs/{run_id}/checkpoints/``::

    ep{E}-ba{B}/            one checkpoint (B = global batches done, E = epochs done)
        .metadata, __*.distcp   DCP: model and optimizer, sharded as the run holds them
        trainer.pt          rank 0: LR scheduler, grad scaler, algorithm state, time, data position
                            (sharded tensors in it, e.g. EMA/SWA averages under FSDP, stored whole)
        rank{r}.pt          every rank: its RNG states
        COMMITTED           JSON, written last by rank 0: step, epoch, time, bytes, world size, fingerprint,
                            inputs (the image size: what else rebuilds the model, for exports)

A checkpoint counts only once ``COMMITTED`` exists. DCP's final step gathers every rank's write
result on rank 0 and broadcasts the outcome, so when ``dcp.save`` returns on rank 0 every rank
has finished writing (the barrier); rank 0 then checks that every file is there (DCP's data
files as ``.metadata`` names them, ``trainer.pt``, each rank's file) and only then writes the
marker. A folder without the marker is a torn write: never loaded, deleted by retention once a
newer one is committed. A step saved again (a resume from an older checkpoint) loses its old
marker before any rank rewrites a file. A committed checkpoint that has lost a file since (or
whose marker or ``.metadata`` no longer parses) counts as torn: a resume skips it with a warning
and a run note (``latest_committed``), and retention does not keep it in place of one that loads
(as last checked: a checkpointer remembers the folders it found whole).

Every save is collective: all ranks call ``save`` at the same step. Failures are collective
too (DCP raises on every rank if any rank failed; the per-rank files are agreed on with an
all-reduce), so all ranks retry together and agree on the outcome. ``async_save`` stages a
copy of the state in memory and writes it from a background thread, over a separate gloo
process group so its collectives never interleave with training's. Loads fetch each needed
byte range once, several at a time (``workers.checkpoint.reader``).
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from workers.checkpoint.contents import check_compatible, spec_hash
from workers.checkpoint.reader import ParallelFsspecReader
from workers.checkpoint.safe_load import load_state
from workers.checkpoint.storage import FsspecStorage, join, with_retries
from workers.s3_limits import bound_retries, storage_options

log = logging.getLogger(__name__)

MARKER = "COMMITTED"
# Files each rank writes in parallel. One file per rank uploads one part at a time and reached
# ~0.3x a boto3 multipart upload of the same bytes to S3; 8 files reach parity (bench/checkpoint.py).
WRITE_THREADS = 8
NAME_RE = re.compile(r"^ep(\d+)-ba(\d+)$")


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    url: str
    epoch: int
    step: int
    committed: bool


def checkpoint_name(*, epoch: int, step: int) -> str:
    return f"ep{epoch}-ba{step}"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _agreement_group() -> Any:
    """A new gloo group of every rank. On gloo the ranks pass a barrier first: making a group
    waits on the store for every rank, and a rank that died before it (a failed build) would
    hold the others there for the store's timeout (30 minutes), where the barrier's
    connections fail at once ("Connection closed by peer"). (On NCCL a barrier may guess the
    wrong device; Ray Train's worker groups there end every rank when one fails.)"""
    if dist.get_backend() == "gloo":
        dist.barrier()
    return dist.new_group(backend="gloo")


def _staged_copy(value: Any) -> Any:
    """A copy of a state dict whose tensors training will not change under a background write."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, _FullTensor):  # on one rank, full_tensor() may be the live tensor itself
        return _FullTensor(value.tensor.detach().clone(), value.placements)
    if isinstance(value, dict):
        return {k: _staged_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_staged_copy(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_staged_copy(v) for v in value)
    return value


@dataclass
class _FullTensor:
    """A DTensor of the trainer state (EMA/SWA averages of FSDP parameters), stored whole.

    ``trainer.pt`` is written by rank 0 alone, so a sharded tensor in it would keep rank 0's
    shard only; stored whole it reshards onto any world size on load."""

    tensor: torch.Tensor
    placements: tuple[Any, ...]


def _gather_dtensors(value: Any) -> Any:
    """``value`` with every DTensor replaced by a ``_FullTensor`` (collective: all-gathers, in
    the same order on every rank)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return _FullTensor(value.full_tensor().cpu(), tuple(value.placements))
    if isinstance(value, dict):
        return {k: _gather_dtensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_gather_dtensors(v) for v in value)
    return value


def _redistribute(value: Any, mesh: Any, device: torch.device) -> Any:
    """Undo ``_gather_dtensors`` for a model sharded over ``mesh`` (None: keep tensors whole).
    Every rank holds the whole tensor, so each takes its shard without communication."""
    from torch.distributed.tensor import distribute_tensor

    if isinstance(value, _FullTensor):
        if mesh is None:
            return value.tensor.to(device)
        return distribute_tensor(value.tensor.to(device), mesh, list(value.placements), src_data_rank=None)
    if isinstance(value, dict):
        return {k: _redistribute(v, mesh, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redistribute(v, mesh, device) for v in value)
    return value


def _mesh_and_device(model: torch.nn.Module) -> tuple[Any, torch.device]:
    from torch.distributed.tensor import DTensor

    for param in model.parameters():
        if isinstance(param, DTensor):
            return param.device_mesh, param.device
        return None, param.device
    return None, torch.device("cpu")


def _to_bytes(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes, what: str = "a checkpoint state file") -> Any:
    # Allow-listed: a planted pickle in storage must not run. _FullTensor: FSDP's gathered tensors.
    return load_state(data, what=what, extra_globals=[_FullTensor])


class Checkpointer:
    """One rank's handle on a run's checkpoint folder; see the module docstring.

    ``on_report(report: dict)`` is called on rank 0 (from a background thread with
    ``async_save``) for every commit and every save that failed, with the fields of
    ``api.views.CheckpointReport``; ``on_note(message)`` on rank 0 when retention fails (a run
    event: the folder keeps growing until a later retention succeeds). ``outcomes`` maps each
    step this rank 0 saved to whether it was committed.
    """

    def __init__(self, root_url: str, *, fingerprint: dict[str, Any], keep_last: int = 3, async_save: bool = False,
                 rank: int = 0, world_size: int = 1, on_report: Callable[[dict[str, Any]], None] | None = None,
                 on_note: Callable[[str], None] | None = None, attempts: int = 3, first_delay_s: float = 1.0,
                 inputs: dict[str, Any] | None = None):
        self.storage = FsspecStorage(root_url)
        self.root_url = self.storage.root
        self.fingerprint = fingerprint
        # What else rebuilds the model from the checkpoint alone (the image size picks a stem):
        # kept in the marker, outside the fingerprint, so older checkpoints stay loadable.
        self.inputs = dict(inputs or {})
        self.keep_last, self.async_save = keep_last, async_save
        self.rank, self.world_size = rank, world_size
        self.on_report, self.on_note = on_report, on_note
        self.outcomes: dict[int, bool] = {}
        self.attempts, self.first_delay_s = attempts, first_delay_s
        self._thread: threading.Thread | None = None
        self._whole: set[str] = set()  # URLs of checkpoints found whole (``_missing``)
        self.damaged: list[str] = []  # committed checkpoints the last ``latest_committed`` skipped
        # The agreement flags of a save are CPU tensors, and on GPUs the run's default group is
        # NCCL-only: they go over a gloo group of their own. Async writes run all their
        # collectives (DCP's too) from a background thread, over this group.
        self._group = _agreement_group() if _distributed() else None

    # --- listing ------------------------------------------------------------------------
    def checkpoints(self) -> list[CheckpointInfo]:
        """Every checkpoint folder, oldest first."""
        infos = []
        for name in self.storage.listdir(self.root_url):
            match = NAME_RE.match(name)
            if match:
                url = join(self.root_url, name)
                infos.append(CheckpointInfo(name, url, int(match[1]), int(match[2]),
                                            self.storage.isfile(join(url, MARKER))))
        return sorted(infos, key=lambda i: (i.step, i.epoch))

    def latest_committed(self) -> CheckpointInfo | None:
        """The newest checkpoint with its commit marker and all its files; torn writes are
        skipped, and so, with a warning (and a note on the resume: ``agreed_latest``), is a
        committed checkpoint that has lost a file since."""
        self.damaged = []
        for info in reversed([info for info in self.checkpoints() if info.committed]):
            missing = self._missing(info)
            if not missing:
                return info
            log.warning("checkpoint %s is committed but %s missing: not loadable, skipped", info.url,
                        ", ".join(missing))
            self.damaged.append(f"{info.url} (missing {', '.join(missing[:5])})")
        return None

    def missing_files(self, url: str, world_size: int, *, metadata: Any = None) -> list[str]:
        """The files of a whole checkpoint (its marker aside) that the folder ``url`` lacks: DCP's
        ``.metadata`` and every data file it names, ``trainer.pt`` and each rank's own file.
        ``metadata``: what ``dcp.save`` returned for it (else ``.metadata`` is read back)."""
        present = set(self.storage.listdir(url))
        needed = [".metadata", "trainer.pt", *(f"rank{rank}.pt" for rank in range(world_size))]
        missing = [name for name in needed if name not in present]
        if ".metadata" not in missing:
            if metadata is None or metadata.storage_data is None:
                # torch 2.11's dcp.save returns its Metadata with storage_data None (seen on a
                # GPU machine with 2.11.0+cu130; 2.14 fills it in): read the written one back.
                metadata = ParallelFsspecReader(url).read_metadata()
            data = {item.relative_path for item in metadata.storage_data.values()}
            missing += sorted(data - present)
        return missing

    def _missing(self, info: CheckpointInfo) -> list[str]:
        """``missing_files`` of a committed checkpoint, at the world size that wrote it. A folder
        found whole once is remembered as whole by this checkpointer (retention asks each commit)."""
        if info.url in self._whole:
            return []
        try:
            missing = self.missing_files(info.url, self.marker(info).get("world_size", 1))
        except OSError:  # storage away (or the folder went meanwhile): the caller retries
            raise
        except Exception as exc:  # a marker or .metadata that does not parse: as good as missing
            return [f"{MARKER} or .metadata, unreadable ({type(exc).__name__}: {str(exc)[:200]})"]
        if not missing:
            self._whole.add(info.url)
        return missing

    def marker(self, info: CheckpointInfo) -> dict[str, Any]:
        return json.loads(self.storage.read_bytes(join(info.url, MARKER)))

    # --- saving -------------------------------------------------------------------------
    def save(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any],
             rank_state: dict[str, Any], epoch: int, step: int) -> None:
        """Save collectively (every rank calls this at the same step). Returns once written, or
        with ``async_save`` once staged; a failed save is reported and training goes on."""
        self.wait()  # one write in flight at a time
        trainer_state = _gather_dtensors(trainer_state)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        name = checkpoint_name(epoch=epoch, step=step)
        if self.async_save:
            staged = _staged_copy(state)
            trainer_state, rank_state = _staged_copy(trainer_state), _staged_copy(rank_state)
            self._thread = threading.Thread(target=self._write, name=f"tessera-ckpt-{name}", daemon=True,
                                            args=(name, staged, trainer_state, rank_state, epoch, step, self._group))
            self._thread.start()
        else:
            self._write(name, state, trainer_state, rank_state, epoch, step, None)  # DCP on the default group

    def wait(self) -> None:
        """Block until the in-flight async write (if any) has finished."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Wait for the in-flight write, then free this checkpointer's process group: a process
        that trains one run after another on the same process group (a sweep trial's ranks,
        ``workers.tune.actor_ranks``) would otherwise keep one gloo group per run."""
        self.wait()
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None

    def _write(self, name: str, state: dict[str, Any], trainer_state: dict[str, Any], rank_state: dict[str, Any],
               epoch: int, step: int, group: Any) -> None:
        url = join(self.root_url, name)
        started = time.monotonic()
        self._whole.discard(url)  # written again: what was found whole before says nothing now
        try:
            saved = with_retries(lambda: self._write_files(url, state, trainer_state, rank_state, group),
                                 what=f"saving checkpoint {name}", attempts=self.attempts,
                                 first_delay_s=self.first_delay_s)
            if self.rank != 0:
                return
            missing = self.missing_files(url, self.world_size, metadata=saved)
            if missing:  # written and then gone: committing would promise what a resume cannot load
                raise FileNotFoundError(f"{', '.join(missing[:5])} missing from {url} after every rank wrote it")
            self._whole.add(url)
            size = self.storage.size(url)
            meta = {"step": step, "epoch": epoch, "time": datetime.now(timezone.utc).isoformat(),
                    "bytes": size, "world_size": self.world_size, "fingerprint": self.fingerprint,
                    "spec_hash": spec_hash(self.fingerprint), "inputs": self.inputs}
            with_retries(lambda: self.storage.write_bytes(join(url, MARKER), json.dumps(meta).encode()),
                         what=f"committing checkpoint {name}", attempts=self.attempts,
                         first_delay_s=self.first_delay_s)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.error("checkpoint %s not committed: %s", url, error)
            if self.rank == 0:
                self.outcomes[step] = False
                self._report(step=step, epoch=epoch, url=url, committed=False, error=error[:20_000])
            return
        self.outcomes[step] = True
        log.info("checkpoint %s committed (%d bytes, %.2fs)", url, size, time.monotonic() - started)
        self._report(step=step, epoch=epoch, url=url, committed=True, bytes=size, time=meta["time"])
        try:
            self.retain()
        except Exception as exc:  # retention can wait for the next commit, but say so
            log.exception("retention of %s failed", self.root_url)
            self._note(f"old checkpoints in {self.root_url} could not be deleted (keep_last={self.keep_last}): "
                       f"{type(exc).__name__}: {exc}; the next commit tries again")

    def _write_files(self, url: str, state: dict[str, Any], trainer_state: dict[str, Any],
                     rank_state: dict[str, Any], group: Any) -> Any:
        """One try at writing every file of a checkpoint but its marker (collective); returns
        DCP's metadata of what it wrote."""
        def uncommit() -> None:
            # A step saved again (a resume from an older checkpoint) loses its marker before any
            # rank rewrites a file (the others wait in ``_agreed``), so a write that dies halfway
            # is a torn write, not a committed mix of two saves.
            if self.rank == 0 and self.storage.isfile(join(url, MARKER)):
                self.storage.remove(join(url, MARKER))

        def write_own_files() -> None:
            self.storage.write_bytes(join(url, f"rank{self.rank}.pt"), _to_bytes(rank_state))
            if self.rank == 0:
                self.storage.write_bytes(join(url, "trainer.pt"), _to_bytes(trainer_state))

        self._agreed(uncommit, url, "uncommit")
        self._agreed(write_own_files, url, "write its files of")  # before the collective DCP write
        writer = FsspecWriter(url, thread_count=WRITE_THREADS, **storage_options(url))  # bounded waits on S3
        bound_retries(writer.fs.fs)  # and tries (DCP builds its file system itself)
        return dcp.save(state, storage_writer=writer, process_group=group, no_dist=not _distributed())

    def _agreed(self, action: Callable[[], None], url: str, what: str) -> None:
        """``action()`` on this rank. With several ranks every rank learns whether all of theirs
        succeeded (one all-reduce, which also makes each wait for the others) and all raise
        together if one failed; a rank alone raises what ``action`` raised."""
        if not _distributed():
            action()
            return
        ok = True
        try:
            action()
        except Exception:
            ok = False
            log.exception("rank %d could not %s %s", self.rank, what, url)
        flag = torch.tensor([0 if ok else 1])
        dist.all_reduce(flag, group=self._group)
        if flag.item():
            raise OSError(f"a rank could not {what} checkpoint {url}")

    def _report(self, **fields: Any) -> None:
        if self.on_report is None:
            return
        fields.setdefault("time", datetime.now(timezone.utc).isoformat())
        fields.setdefault("bytes", 0)
        try:
            self.on_report({"world_size": self.world_size, **fields})
        except Exception:
            log.exception("reporting checkpoint %s failed", fields.get("url"))

    def _note(self, message: str) -> None:
        if self.on_note is None:
            return
        try:
            self.on_note(message[:2_000])
        except Exception:
            log.exception("reporting a note on %s failed", self.root_url)

    def retain(self) -> list[str]:
        """Keep the newest ``keep_last`` committed checkpoints; delete older ones and torn
        writes older than the newest commit (a newer uncommitted one may still be in flight). A
        committed checkpoint that has lost a file counts as torn."""
        infos = self.checkpoints()
        # A committed checkpoint that has lost a file counts as a torn write: it must not take
        # the place of one a resume can load.
        committed = [info for info in infos if info.committed and not self._missing(info)]
        doomed = committed[:-self.keep_last] if len(committed) > self.keep_last else []
        if committed:
            doomed += [info for info in infos if info not in committed and info.step < committed[-1].step]
        for info in doomed:
            self.storage.remove(info.url)
        return [info.name for info in doomed]

    # --- loading ------------------------------------------------------------------------
    def load(self, info: CheckpointInfo, *, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Load model and optimizer in place (resharded to this world size); return the trainer
        state and this rank's own state (None when the checkpoint had another world size)."""
        meta = self.marker(info)
        check_compatible(meta["fingerprint"], self.fingerprint, url=info.url)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=ParallelFsspecReader(info.url), no_dist=not _distributed())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        trainer_state = _redistribute(_from_bytes(self.storage.read_bytes(join(info.url, "trainer.pt")),
                                                       join(info.url, "trainer.pt")),
                                      *_mesh_and_device(model))
        rank_state = None
        if meta["world_size"] == self.world_size:
            rank_url = join(info.url, f"rank{self.rank}.pt")
            rank_state = _from_bytes(self.storage.read_bytes(rank_url), rank_url)
        return trainer_state, rank_state

    def agreed_latest(self) -> CheckpointInfo | None:
        """``latest_committed`` as rank 0 sees it, the same on every rank."""
        choice: list[Any] = [None]
        if self.rank == 0:
            try:
                choice[0] = with_retries(self.latest_committed, what=f"listing {self.root_url}",
                                         attempts=self.attempts, first_delay_s=self.first_delay_s)
            except Exception as exc:  # sent on, so that every rank raises, none waits for rank 0
                choice[0] = f"{type(exc).__name__}: {exc}"
            for damaged in self.damaged:
                self._note(f"checkpoint {damaged} is committed but cannot be loaded; resuming from the newest "
                           f"one that can, if any")
        if _distributed():
            dist.broadcast_object_list(choice, src=0)
        if isinstance(choice[0], str):
            raise OSError(f"could not find the newest checkpoint in {self.root_url}: {choice[0]}")
        return choice[0]


def read_checkpoint(url: str) -> dict[str, Any]:
    """The whole model and optimizer state of a checkpoint folder as plain (unsharded) tensors,
    in this process, whatever world size wrote it: ``{"model": {...}, "optim": {...}}``."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    return _load_state_dict_from_keys(storage_reader=ParallelFsspecReader(url))
