"""Reading DCP checkpoints from object stores: each needed byte range fetched once, in parallel.

torch's ``FsspecReader`` opens one stream per file and reads the items of the load plan in
plan order, one after another, through fsspec's read-ahead cache. The plan is not in offset
order (for a resnet18 checkpoint it walks files mostly backwards), and each backward seek makes
s3fs issue a new ranged GET from there to the end of the file: a 135 MB checkpoint cost 42
requests and 328 MB, one request at a time (bench/checkpoint.py).

``ParallelFsspecReader`` sorts each file's items by offset, coalesces them into contiguous
spans, splits spans at item boundaries into chunks of about ``CHUNK_BYTES``, and fetches the
chunks with ``thread_count`` ranged reads in flight. Deserialization stays on the calling
thread (the load planner is not thread-safe), and at most ``thread_count`` chunks are held in
memory at a time. The bytes read are the bytes written, so loads stay bitwise exact.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view
from torch.futures import Future as TorchFuture

from workers.checkpoint.safe_load import load_metadata, load_state
from workers.s3_limits import bound_retries, storage_options

READ_THREADS = 8
# Chunks of this size keep every reader thread busy on a rank's files (8 files of ~17 MB for a
# resnet18 + AdamW checkpoint) while bounding memory to about READ_THREADS chunks.
CHUNK_BYTES = 16 << 20
# Unneeded bytes between two needed items that are still read rather than split into two
# requests (resharded loads need parts of files; one request costs more than 1 MiB on S3).
MAX_GAP_BYTES = 1 << 20


@dataclass
class _Chunk:
    """One ranged read: ``[start, end)`` of ``relative_path``, holding these plan items."""

    relative_path: str
    start: int
    end: int
    items: list[ReadItem]


def plan_chunks(items_by_file: dict[str, list[tuple[ReadItem, int, int]]], *, chunk_bytes: int = CHUNK_BYTES,
                max_gap: int = MAX_GAP_BYTES) -> list[_Chunk]:
    """Group ``(item, offset, length)`` per file into ranged reads, in offset order: items closer
    than ``max_gap`` share a read, and a read grows past ``chunk_bytes`` only by one item."""
    chunks = []
    for path, entries in items_by_file.items():
        current: _Chunk | None = None
        for item, offset, length in sorted(entries, key=lambda e: e[1]):
            end = offset + length
            if current is not None and offset - current.end <= max_gap and current.end - current.start < chunk_bytes:
                current.end = max(current.end, end)
                current.items.append(item)
                continue
            current = _Chunk(path, offset, end, [item])
            chunks.append(current)
    return chunks


class ParallelFsspecReader(FsspecReader):
    """``FsspecReader`` that fetches each needed byte range once, ``thread_count`` at a time."""

    def __init__(self, path: str | os.PathLike, *, thread_count: int = READ_THREADS, chunk_bytes: int = CHUNK_BYTES,
                 **kwargs: Any) -> None:
        # S3's bounded waits (``storage_options``) unless the caller gives its own options.
        super().__init__(path, **{**storage_options(os.fspath(path)), **kwargs})
        bound_retries(self.fs.fs)
        self.thread_count, self.chunk_bytes = max(1, thread_count), chunk_bytes

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """DCP's ``.metadata``, unpickled with an allow-list (DCP itself uses ``pickle.load``)."""
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = load_metadata(metadata_file, what=str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        by_file: dict[str, list[tuple[ReadItem, int, int]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            by_file.setdefault(info.relative_path, []).append((item, info.offset, info.length))
        chunks = plan_chunks(by_file, chunk_bytes=self.chunk_bytes)
        fs = self.fs.fs

        def fetch(chunk: _Chunk) -> bytes:
            path = os.fspath(self.fs.concat_path(self.path, chunk.relative_path))
            return fs.cat_file(path, start=chunk.start, end=chunk.end)

        pending = iter(chunks)
        with ThreadPoolExecutor(self.thread_count, thread_name_prefix="tessera-dcp-read") as pool:
            in_flight: dict[Future[bytes], _Chunk] = {}

            def refill() -> None:
                while len(in_flight) < self.thread_count:
                    chunk = next(pending, None)
                    if chunk is None:
                        return
                    in_flight[pool.submit(fetch, chunk)] = chunk

            refill()
            try:
                while in_flight:
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in done:
                        chunk = in_flight.pop(future)
                        data = future.result()
                        if len(data) != chunk.end - chunk.start:
                            raise OSError(f"short read of {chunk.relative_path} [{chunk.start}, {chunk.end}): "
                                          f"{len(data)} bytes")
                        refill()  # keep the fetches going while this chunk is deserialized
                        self._load_chunk(chunk, data, planner)
            finally:
                for future in in_flight:
                    future.cancel()

        fut: TorchFuture[None] = TorchFuture()
        fut.set_result(None)
        return fut

    def _load_chunk(self, chunk: _Chunk, data: bytes, planner: LoadPlanner) -> None:
        """What ``FileSystemReader.read_data`` does per item, over the chunk's bytes in memory."""
        stream = io.BytesIO(data)
        for req in chunk.items:
            info = self.storage_data[req.storage_index]
            view = _create_file_view(stream, info.offset - chunk.start, info.length)
            transform_from = self.transforms.transform_load_stream(req, info.transform_descriptors or (), view)
            if req.type == LoadItemType.BYTE_IO:
                # The planner unpickles these with weights_only=False: check them with the allow-list first.
                raw = transform_from.read(-1)
                load_state(raw, what=f"{chunk.relative_path} item {req.dest_index.fqn}")
                planner.load_bytes(req, io.BytesIO(raw))
                continue
            seekable = transform_from if transform_from.seekable() else io.BytesIO(transform_from.read(-1))
            tensor = cast(torch.Tensor, torch.load(seekable, map_location="cpu", weights_only=True))
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise AssertionError(f"req {req.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
            target.copy_(tensor)
            planner.commit_tensor(req, target)
