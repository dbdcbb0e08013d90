"""``bench/metric_reads.py`` at a tiny size runs end to end on PostgreSQL: each index set's reads
find every point of the rare key, and each set's writes are timed. Not timed itself: a 2-core
machine shared with other jobs cannot hold a speed threshold."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import PG_ADMIN_URL, REPO_ROOT

READS = {"rare_key_whole", "unfiltered_first_page", "common_key_first_page"}


def test_quick_metric_reads_bench_reads_every_rare_point_under_each_index_set(tmp_path):
    out = tmp_path / "metric-reads.json"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "metric_reads.py"), "--points", "3000",
                           "--others", "2", "--other-points", "1000", "--rounds", "1", "--requests", "1",
                           "--batches", "3", "--pg", PG_ADMIN_URL, "--out", str(out)],
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["rare_points"] == 6  # steps 0, 500, ..., 2500 of 3,000 points
    (turn,) = report["rounds"]
    assert set(turn) == {"before", "plans_alone", "after", "key_index"}
    for arm in turn.values():
        assert READS <= set(arm) and all(arm[read]["n"] == 1 for read in READS)
        assert arm["rare_key_plan"].startswith("Limit") and "Execution Time" in arm["common_key_plan"]
    assert {name: times["n"] for name, times in report["writes_ms_per_1000_points"].items()} == {
        "old": 3, "lean": 3, "key": 3}
