"""The control plane stays small: no torch, workers or algorithms, and Ray only on demand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_service_never_imports_torch_workers_or_algorithms_and_ray_only_lazily():
    code = (
        "import sys, pkgutil, importlib, service\n"
        "for mod in pkgutil.walk_packages(service.__path__, 'service.'):\n"
        "    if '.migrations' not in mod.name:\n"
        "        importlib.import_module(mod.name)\n"
        "from service.app import create_app\n"
        "create_app(jobs=object(), run_dispatcher=False)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'workers', 'algorithms', 'ray'))\n"
        "print(bad)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
