"""A code package's pip requirements (``code.requirements``) on a worker: installed by a real
pip once per machine, beside (never over) the worker's own packages."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

from api.code_package import pack_directory
from api.model_specs import CodeRef
from workers.models import user_requirements
from workers.models.code_cache import UserCodeError, verified
from workers.models.user_code import install_code
from tests.workers.byo_helpers import write_user_package, write_wheel

MODULES = ("my_project", "tessera_probe_dep")


@pytest.fixture
def fresh_imports(tmp_path, monkeypatch):
    """A private code cache, this process's import path restored, and the test's modules forgotten."""
    monkeypatch.setenv("TESSERA_CODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # everything the tests ask for is a file or installed already
    monkeypatch.setattr(sys, "path", list(sys.path))

    def forget():
        for name in [n for n in sys.modules if n.split(".")[0] in MODULES]:
            del sys.modules[name]

    forget()
    yield
    forget()


def stored(tmp_path, package) -> str:
    code = tmp_path / "storage" / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / f"{package.digest}.zip").write_bytes(package.data)
    return f"file://{tmp_path}/storage"


def test_requirements_are_installed_beside_the_workers_packages_once_per_machine(tmp_path, fresh_imports, monkeypatch):
    wheel = write_wheel(tmp_path / "wheels", width=6)
    package = pack_directory(write_user_package(tmp_path / "src", needs="tessera_probe_dep"))
    code = CodeRef(digest=package.digest, requirements=[f"tessera_probe_dep @ {wheel.as_uri()}", "packaging>=20"])
    install_code(code, storage_url=stored(tmp_path, package))

    nets = importlib.import_module("my_project.nets")
    assert nets.build(num_classes=4, in_channels=1).out.in_features == 6  # the requirement's WIDTH
    [folder] = (tmp_path / "cache").glob("requirements-*")
    assert verified(folder)
    installed = {p.name for site in user_requirements.site_dirs(folder) if site.is_dir() for p in site.iterdir()}
    assert "tessera_probe_dep.py" in installed
    assert not any(name.startswith("packaging") for name in installed)  # the worker's own packaging satisfied it

    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip ran again: {args}")

    monkeypatch.setattr(subprocess, "run", no_pip)
    del sys.modules["tessera_probe_dep"]
    install_code(code, storage_url=None)  # both in the cache already: nothing fetched, nothing installed
    assert importlib.import_module("tessera_probe_dep").WIDTH == 6


def test_a_requirement_that_would_replace_a_workers_package_fails_with_pips_reason(tmp_path, fresh_imports):
    before = importlib.metadata.version("packaging")
    with pytest.raises(UserCodeError) as caught:
        user_requirements.install_requirements(["packaging==20.0"])
    message = str(caught.value)
    assert message.startswith("code.requirements ['packaging==20.0']: pip could not install them")
    assert "The user requested (constraint) packaging==" in message  # pip's own words: what the worker has
    assert importlib.metadata.version("packaging") == before
    assert not any(verified(p) for p in (tmp_path / "cache").glob("requirements-*"))


def test_no_requirements_install_nothing(tmp_path, fresh_imports):
    assert user_requirements.install_requirements([]) is None
    assert not (tmp_path / "cache").exists()


def test_the_cache_key_changes_with_the_requirements_and_the_workers_packages():
    installed = {"torch": "2.14.1", "numpy": "2.4.6"}
    key = user_requirements.requirements_key(["a==1", "b"], installed)
    assert key == user_requirements.requirements_key(["b", "a==1"], dict(reversed(installed.items())))
    assert key != user_requirements.requirements_key(["a==2", "b"], installed)
    assert key != user_requirements.requirements_key(["a==1", "b"], {**installed, "numpy": "2.5.0"})
