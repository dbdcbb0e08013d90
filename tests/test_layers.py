"""The layers' import rules, enforced: who may import whom.

    api/         pydantic, httpx only (no torch, no ray): the contract and the SDK
    algorithms/  torch, torchvision, numpy, PIL (torchvision's image type: Composer's image ops take
                 PIL images), api (and NVIDIA apex, optional, imported lazily by FusedLayerNorm)
    workers/     anything but service and cli
    service/     never torch, workers, algorithms or cli: the control plane runs without torch
    cli/         torch, workers, algorithms and service only lazily, inside the commands that use them

docs/architecture.md ("Layers") explains why; a new package or dependency belongs in the tables
below, not in an exception.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}

ALLOWED = {
    # packaging: parses code.requirements (PEP 508) when a spec is validated.
    "api": {"api", "pydantic", "pydantic_core", "httpx", "typing_extensions", "packaging"},
    # apex: an optional CUDA kernel library, imported inside FusedLayerNorm only when installed.
    "algorithms": {"algorithms", "api", "torch", "torchvision", "numpy", "PIL", "apex"},
}
FORBIDDEN = {
    "service": {"torch", "torchvision", "workers", "algorithms", "cli"},
    "workers": {"service", "cli"},
    "algorithms": {"service", "workers", "cli", "ray"},
}


def imported_top_levels(path: Path, *, module_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if module_level_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def python_files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts or p.name != "env.py")


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) - STDLIB - ALLOWED[package])
        for path in python_files(package)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_never_imports_a_forbidden_layer(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN[package])
        for path in python_files(package)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_cli_imports_torch_only_lazily_inside_commands():
    for path in python_files("cli"):
        assert not imported_top_levels(path, module_level_only=True) & {"torch", "workers", "algorithms", "service"}, path


def test_the_control_plane_and_the_sdk_load_without_torch():
    code = ("import sys, api.client, api.specs, service.app, cli.main; "
            "bad = [m for m in ('torch', 'workers', 'algorithms') if m in sys.modules]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
