"""The checkpoint reader: coalesced ranged reads in offset order, each byte fetched once, loads
bitwise equal to torch's own reader, locally and from S3 over HTTP."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from tests.workers.checkpoint_helpers import flatten
from workers.checkpoint.reader import ParallelFsspecReader, plan_chunks


def test_chunks_coalesce_neighbouring_items_in_offset_order_and_split_at_the_chunk_size():
    items = {"a": [("a3", 300, 100), ("a1", 0, 100), ("a2", 100, 200)],  # plan order is not offset order
             "b": [("b1", 0, 10), ("b2", 5_000_000, 10)]}                  # far apart: two reads
    chunks = plan_chunks(items, chunk_bytes=250, max_gap=1000)
    assert [(c.relative_path, c.start, c.end, c.items) for c in chunks] == [
        ("a", 0, 300, ["a1", "a2"]),  # grows past 250 by one item, then a new read starts
        ("a", 300, 400, ["a3"]),
        ("b", 0, 10, ["b1"]),
        ("b", 5_000_000, 5_000_010, ["b2"]),
    ]


def state_to_save() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(6)])
    return {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "extra": {"step": 7, "name": "x"}}  # non-tensors travel as BYTE_IO items


def zeros_like(state: dict) -> dict:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "extra": {"step": 0, "name": ""}}


def load_with(reader, saved: dict) -> dict:
    target = zeros_like(saved)
    dcp.load(target, storage_reader=reader, no_dist=True)
    return target


def assert_same(a: dict, b: dict) -> None:
    fa, fb = flatten(a), flatten(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        if isinstance(fa[key], torch.Tensor):
            assert torch.equal(fa[key], fb[key]), key
        else:
            assert fa[key] == fb[key], key


def test_a_local_checkpoint_loads_bitwise_equal_with_small_chunks_and_one_thread(tmp_path):
    saved = state_to_save()
    url = f"file://{tmp_path}/ckpt"
    dcp.save(saved, storage_writer=FsspecWriter(url, thread_count=3), no_dist=True)
    assert_same(load_with(ParallelFsspecReader(url, thread_count=1, chunk_bytes=1), saved), saved)
    assert_same(load_with(ParallelFsspecReader(url), saved), load_with(FsspecReader(url), saved))


@pytest.mark.integration
def test_loading_from_s3_fetches_each_byte_once_in_a_few_requests(s3_server, monkeypatch):
    saved = state_to_save()
    url = s3_server.url("reader/ckpt")
    dcp.save(saved, storage_writer=FsspecWriter(url, thread_count=4), no_dist=True)
    reader = ParallelFsspecReader(url)
    fs, requests = reader.fs.fs, []
    cat_file = fs.cat_file

    def counted(path, start=None, end=None, **kwargs):
        requests.append((path.rsplit("/", 1)[-1], start, end))
        return cat_file(path, start=start, end=end, **kwargs)

    monkeypatch.setattr(fs, "cat_file", counted)
    loaded = load_with(reader, saved)
    assert_same(loaded, saved)
    files = {name for name, _, _ in requests}
    assert len(files) == 4 and len(requests) == 4  # one ranged GET per data file (all under a chunk)
    data_bytes = sum(fs.size(f"{url}/{name}") for name in files)
    assert sum(end - start for _, start, end in requests) <= data_bytes
