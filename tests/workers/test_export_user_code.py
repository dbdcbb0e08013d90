"""``load_model`` of a model trained from your own code: the export's spec names a code package
(``code.digest``) that is not on ``sys.path``; ``load_model`` installs it through the workers'
``install_code`` cache, from the service (``GET /api/v1/code/{digest}/package``) or from the
storage the export lies in, and returns the model with the saved weights.

The service is the real app on a loopback port (no Ray: exports are written where the trainer
writes them); the exports hold random weights of the byo test model instead of trained ones.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch

from api.code_package import pack_directory
from api.specs import RunSpec
from workers.export import export_metadata, load_model, write_exports
from workers.models.user_code import UserCodeError
from workers.paths import run_url
from tests.conftest import free_port
from tests.dashboard.conftest import LocalService
from tests.workers.byo_helpers import user_spec, write_user_package


def _forget_my_project() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "my_project"]:
        del sys.modules[name]


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """``my_project`` packed from a folder that is not on ``sys.path``, a private code cache,
    and the package forgotten before and after the test."""
    monkeypatch.setenv("TESSERA_CODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    _forget_my_project()
    folder = write_user_package(tmp_path / "src")
    assert importlib.util.find_spec("my_project") is None  # only the package can bring it
    yield folder, pack_directory(folder)
    _forget_my_project()


def write_user_export(run: str, digest: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The byo model's export at step 4 under ``run`` (``{run}/exports/step-4.*``), as the trainer
    writes it: width 8, 1x8x8 inputs, 4 classes; random weights. Returns them and the files' URLs."""
    spec = RunSpec.model_validate(user_spec("byo", digest))
    generator = torch.Generator().manual_seed(0)
    shapes = {"hidden.weight": (8, 64), "hidden.bias": (8,), "out.weight": (4, 8), "out.bias": (4,)}
    state = {key: torch.randn(*shape, generator=generator) for key, shape in shapes.items()}
    metadata = export_metadata(spec, surgery=[], step=4, num_classes=4, in_channels=1, image_size=8, metrics={})
    return state, write_exports(run, state, metadata)


def assert_is_the_export(model: torch.nn.Module, state: dict[str, torch.Tensor], cache: Path) -> None:
    assert type(model).__name__ == "TinyMLP" and not model.training
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state.items())
    assert Path(sys.modules["my_project.nets"].__file__).is_relative_to(cache)  # imported from the code cache
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 4)


def test_a_run_id_and_a_downloaded_file_rebuild_from_the_package_on_the_service(tmp_path, user_package):
    folder, package = user_package
    cache = tmp_path / "cache"
    from api.client import Client

    with LocalService(tmp_path) as service, Client(service.url) as client:
        client.create_project("team")
        run = client.create_run(user_spec("byo", None), code=folder, project="team")
        assert run.spec["code"] == {"digest": package.digest} and run.project == "team"
        storage = f"file://{tmp_path}/home/storage/projects/team"  # the project's storage (LocalService's root)
        state, urls = write_user_export(run_url(storage, run.id), package.digest)

        # A run id: the export and the package both come from the service, the package from the run's project.
        assert_is_the_export(load_model(run.id, service_url=service.url), state, cache / package.digest)

        # A file downloaded with `tessera export`, away from storage, loaded in a fresh process (fresh cache).
        downloaded = tmp_path / "model.pt"
        client.download_model(run.id, downloaded, fmt="torch")
        shutil.rmtree(cache)
        _forget_my_project()
        with pytest.raises(UserCodeError) as not_in_default:  # the key's default project holds no such package
            load_model(str(downloaded), service_url=service.url)
        message = str(not_in_default.value)
        assert message.startswith(f"code.digest {package.digest}: the service at {service.url} has no such package "
                                  "in the API key's default project") and "pass project=" in message
        # Nothing half-installed: no folder (the lock file that marks the digest in use may stay).
        assert not cache.exists() or not [p for p in cache.iterdir() if not p.name.startswith(".")]
        assert_is_the_export(load_model(str(downloaded), service_url=service.url, project="team"), state,
                             cache / package.digest)


def test_an_export_in_storage_takes_its_package_from_beside_it_without_a_service(tmp_path, user_package):
    folder, package = user_package
    cache = tmp_path / "cache"
    storage = tmp_path / "storage"
    state, urls = write_user_export(run_url(f"file://{storage}", "r1"), package.digest)
    no_service = f"http://127.0.0.1:{free_port()}"

    (storage / "code").mkdir()
    stored = storage / "code" / f"{package.digest}.zip"
    stored.write_bytes(package.data)  # where the service stores it: {storage}/code/{digest}.zip
    for source in (urls["safetensors"], urls["torch"].removeprefix("file://")):  # a URL, a path
        assert_is_the_export(load_model(source, service_url=no_service), state, cache / package.digest)

    stored.unlink()
    _forget_my_project()
    assert_is_the_export(load_model(urls["safetensors"], service_url=no_service), state,  # the cache has it
                         cache / package.digest)

    shutil.rmtree(cache)
    _forget_my_project()
    with pytest.raises(UserCodeError, match=rf"code.digest {package.digest}: cannot download the package from the "
                                            rf"service at {no_service}: ConnectError"):
        load_model(urls["safetensors"], service_url=no_service)

    stored.write_bytes(package.data + b"tampered")
    with pytest.raises(UserCodeError, match=f"{stored}.* holds other bytes"):
        load_model(urls["safetensors"], service_url=no_service)
    assert not (cache / package.digest).exists()

    # No package to be had, but my_project is importable here anyway (as load_model needed before):
    # that one is used, with a warning that it may not be the code the run trained.
    stored.unlink()
    sys.path.insert(0, str(folder.parent))
    with pytest.warns(UserWarning, match=rf"code.digest {package.digest}: cannot download .*; importing "
                                         rf"'my_project' from {folder}/__init__.py instead, which may differ"):
        model = load_model(urls["safetensors"], service_url=no_service)
    assert Path(sys.modules["my_project.nets"].__file__) == folder / "nets.py"
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state.items())


def test_a_built_in_model_with_a_code_package_needs_no_package_to_load(tmp_path, monkeypatch):
    """Its spec may name a package (the workers install it), but the model is built without it:
    nothing is fetched, so an unreachable service changes nothing."""
    from tests.service.conftest import EXAMPLE_SPEC_YAML
    import yaml

    from workers.export import install_export_code

    monkeypatch.setenv("TESSERA_URL", f"http://127.0.0.1:{free_port()}")  # nobody listens there
    spec = RunSpec.model_validate({**yaml.safe_load(EXAMPLE_SPEC_YAML), "code": {"digest": "a" * 64}})
    metadata = {"tessera.spec": spec.model_dump_json()}
    assert install_export_code(metadata, str(tmp_path / "model.safetensors")) is None
