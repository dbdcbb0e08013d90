"""A code package's pip requirements (``code.requirements``) on a worker: installed by a real
pip once per machine, beside (never over) the worker's own packages."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import zipfile

import pytest

from api.code_package import pack_directory
from api.model_specs import CodeRef
from workers.models import user_requirements
from workers.models.code_cache import verified
from workers.models.user_requirements import RequirementsError
from workers.models.user_code import install_code
from tests.workers.byo_helpers import store, write_user_package, write_wheel

MODULES = ("my_project", "tessera_probe_dep")


@pytest.fixture
def fresh_imports(tmp_path, monkeypatch):
    """A private code cache, this process's import path restored, and the test's modules forgotten."""
    monkeypatch.setenv("TESSERA_CODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # everything the tests ask for is a file or installed already
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(user_requirements, "_in_use", [])

    def forget():
        for name in [n for n in sys.modules if n.split(".")[0] in MODULES]:
            del sys.modules[name]

    forget()
    yield
    forget()


def test_requirements_are_installed_beside_the_workers_packages_once_per_machine(tmp_path, fresh_imports, monkeypatch,
                                                                                caplog):
    wheel = write_wheel(tmp_path / "wheels", width=6)
    package = pack_directory(write_user_package(tmp_path / "src", needs="tessera_probe_dep"))
    code = CodeRef(digest=package.digest, requirements=[f"tessera_probe_dep @ {wheel.as_uri()}", "packaging>=20"])
    with caplog.at_level("INFO", logger=user_requirements.__name__):
        install_code(code, storage_url=store(tmp_path, package))
    # The run's log says what the minutes in STARTING went to.
    said = [record.getMessage() for record in caplog.records if record.name == user_requirements.__name__]
    assert len(said) == 2 and said[0].startswith(f"installing code.requirements {code.requirements} with pip")
    assert re.fullmatch(rf"installed code\.requirements .* in \d+\.\d s", said[1]), said

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
    with pytest.raises(RequirementsError) as caught:
        user_requirements.install_requirements(["packaging==20.0"])
    message = str(caught.value)
    assert message.startswith("code.requirements ['packaging==20.0']: pip could not install them")
    assert "The user requested (constraint) packaging==" in message  # pip's own words: what the worker has
    assert importlib.metadata.version("packaging") == before
    assert not any(verified(p) for p in (tmp_path / "cache").glob("requirements-*"))


def test_a_failed_install_is_answered_from_its_failure_for_the_other_ranks(tmp_path, fresh_imports, monkeypatch):
    with pytest.raises(RequirementsError) as first:
        user_requirements.install_requirements(["packaging==20.0"])
    pips = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: pips.append(a))
    with pytest.raises(RequirementsError) as second:  # the next rank on this machine: no second pip
        user_requirements.install_requirements(["packaging==20.0"])
    assert str(second.value) == str(first.value) and pips == []
    monkeypatch.setattr(user_requirements, "FAILURE_REUSED_S", 0)  # later, pip is asked again
    with pytest.raises(Exception):
        user_requirements.install_requirements(["packaging==20.0"])
    assert len(pips) == 1


def test_no_requirements_install_nothing(tmp_path, fresh_imports):
    assert user_requirements.install_requirements([]) is None
    assert not (tmp_path / "cache").exists()


def test_the_cache_key_changes_with_the_requirements_and_the_workers_packages():
    installed = {"torch": "2.14.1", "numpy": "2.4.6"}
    key = user_requirements.requirements_key(["a==1", "b"], installed)
    assert key == user_requirements.requirements_key(["b", "a==1"], dict(reversed(installed.items())))
    assert key != user_requirements.requirements_key(["a==2", "b"], installed)
    assert key != user_requirements.requirements_key(["a==1", "b"], {**installed, "numpy": "2.5.0"})


def test_a_package_the_worker_has_is_never_replaced_by_a_requirement(tmp_path, fresh_imports, monkeypatch):
    # The worker "has" tessera_probe_dep 1.0 (a wheel unpacked is an installed layout); a run asks for 2.0.
    site_packages = tmp_path / "workers-site-packages"
    zipfile.ZipFile(write_wheel(tmp_path / "v1", version="1.0", width=1)).extractall(site_packages)
    monkeypatch.syspath_prepend(str(site_packages))
    monkeypatch.setenv("PYTHONPATH", str(site_packages))  # pip, in its own process, sees it too
    assert importlib.metadata.version("tessera_probe_dep") == "1.0"
    newer = write_wheel(tmp_path / "v2", version="2.0", width=2)
    with pytest.raises(RequirementsError, match="fails rather than replace it") as caught:
        user_requirements.install_requirements([f"tessera_probe_dep @ {newer.as_uri()}"])
    assert "The user requested (constraint) tessera-probe-dep==1.0" in str(caught.value)
    assert (site_packages / "tessera_probe_dep-1.0.dist-info").is_dir()
    assert importlib.import_module("tessera_probe_dep").WIDTH == 1


def test_a_second_set_of_requirements_in_one_process_replaces_the_first(tmp_path, fresh_imports):
    first = write_wheel(tmp_path / "v1", version="1.0", width=1)
    second = write_wheel(tmp_path / "v2", version="2.0", width=2)
    user_requirements.install_requirements([f"tessera_probe_dep @ {first.as_uri()}"])
    assert importlib.import_module("tessera_probe_dep").WIDTH == 1
    user_requirements.install_requirements([f"tessera_probe_dep @ {second.as_uri()}"])  # load_model, another run
    assert importlib.import_module("tessera_probe_dep").WIDTH == 2
    assert sum("requirements-" in p for p in sys.path) == 1
    user_requirements.install_requirements([])  # a run without requirements imports none of them
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("tessera_probe_dep")


def test_a_worker_without_pip_says_so(tmp_path, fresh_imports, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else find_spec(name, *a))
    with pytest.raises(RequirementsError, match=r"pip is not installed in the workers' Python \(.*python"):
        user_requirements.install_requirements(["einops==0.8.1"])
