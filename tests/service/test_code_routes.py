"""``POST /api/v1/code``, ``HEAD|GET /api/v1/code/{digest}`` and runs that name a package, on
SQLite and PostgreSQL, with packages stored in a local storage folder."""

from __future__ import annotations

import copy
import io
import uuid
import zipfile

import pytest

from api.code_package import pack_directory, sha256_hex
from service.settings import Settings

API = "/api/v1"

from tests.conftest import ADMIN_HEADERS


@pytest.fixture(params=["sqlite", "postgresql"])
def code_client(request, tmp_path, fake_jobs):
    """An app over SQLite or the session's PostgreSQL whose storage folder is this test's own."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from service.app import create_app

    database = {}
    if request.param == "postgresql":
        engine = request.getfixturevalue("_postgres_engine")
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE metrics, run_events, runs, sweeps RESTART IDENTITY CASCADE"))
        database = {"database_url": request.getfixturevalue("postgres_url")}
    settings = Settings(home=tmp_path / "home", public_url="http://tessera.test:8000",
                        storage_url=f"file://{tmp_path}/storage", **database)
    with TestClient(create_app(settings, jobs=fake_jobs, run_dispatcher=False),
                    raise_server_exceptions=False, headers=ADMIN_HEADERS) as client:
        yield client


# A builder the contract accepts; the service stores packages and never imports them.
NETS = ("import torch.nn as nn\n\n\ndef build(num_classes, in_channels, width=8):\n"
        "    return nn.Sequential(nn.Flatten(), nn.LazyLinear(width), nn.ReLU(), nn.Linear(width, num_classes))\n"
        "\n\nbuild_wide = build\n")


def stub_project(folder):
    """``folder/my_project``, a package whose ``nets.build`` only has to be importable; returns it."""
    root = folder / "my_project"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "nets.py").write_text(NETS)
    return root


@pytest.fixture
def package(tmp_path):
    return pack_directory(stub_project(tmp_path))


def upload(client, data: bytes, digest: str | None = None):
    return client.post(f"{API}/code", params={"digest": digest or sha256_hex(data)}, content=data,
                       headers={"Content-Type": "application/zip"})


def test_a_package_is_stored_once_under_its_digest(code_client, package, tmp_path):
    assert code_client.head(f"{API}/code/{package.digest}").status_code == 404
    first = upload(code_client, package.data)
    assert first.status_code == 201, first.text
    assert first.json() == {"digest": package.digest, "size": len(package.data), "num_files": 2,
                            "top_level": ["my_project"], "created": True}
    stored = tmp_path / "storage" / "code" / f"{package.digest}.zip"
    assert stored.read_bytes() == package.data
    mtime = stored.stat().st_mtime_ns
    again = upload(code_client, package.data)
    assert again.status_code == 200 and again.json()["created"] is False
    assert stored.stat().st_mtime_ns == mtime  # not written twice
    assert code_client.head(f"{API}/code/{package.digest}").status_code == 200
    assert code_client.get(f"{API}/code/{package.digest}").json()["top_level"] == ["my_project"]
    assert list((tmp_path / "storage" / "code").iterdir()) == [stored]  # no partial files left


def test_a_digest_that_does_not_match_the_body_is_refused(code_client, package, tmp_path):
    response = upload(code_client, package.data, digest="0" * 64)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["field"] == "digest" and item["input"] == "0" * 64 and package.digest in item["msg"]
    assert not (tmp_path / "storage" / "code").exists()
    malformed = upload(code_client, package.data, digest="not-a-sha")
    assert malformed.status_code == 422 and malformed.json()["detail"][0]["field"] == "digest"


def zip_of_sources(files: dict[str, str]) -> bytes:
    """A zip holding each of ``files`` (its path in the zip: its text), in order."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def zip_with(name: str) -> bytes:
    return zip_of_sources({"pkg/__init__.py": "", name: "print('hi')"})


@pytest.mark.parametrize(("data", "problem"), [
    (b"this is not a zip", "not a zip archive"),
    (zip_with("../../outside.py"), "'../../outside.py' leaves the package"),
    (zip_with("/abs/path.py"), "'/abs/path.py' has an absolute"),
])
def test_bad_packages_get_a_422_that_names_the_problem(code_client, data, problem, tmp_path):
    response = upload(code_client, data)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert item["field"] == "body" and problem in item["msg"] and "not an acceptable code package" in item["msg"]
    assert not (tmp_path / "storage" / "code").exists()


def test_an_oversized_package_gets_a_413(code_client, monkeypatch):
    from service.routes import code as code_routes

    monkeypatch.setattr(code_routes, "MAX_PACKAGE_BYTES", 100)
    response = upload(code_client, b"x" * 101)
    assert response.status_code == 413 and "larger than 100 bytes" in response.json()["detail"]


def imported_run(example_body, digest: str) -> dict:
    return {**example_body, "model": {"import": "my_project.nets:build", "params": {"width": 8}},
            "algorithms": [], "code": {"digest": digest}}


def test_a_run_may_name_only_a_stored_package(code_client, example_body, package):
    refused = code_client.post(f"{API}/runs", json=imported_run(example_body, package.digest))
    assert refused.status_code == 422
    [item] = refused.json()["detail"]
    assert item["field"] == "code.digest" and item["input"] == package.digest and "upload it first" in item["msg"]
    assert code_client.get(f"{API}/runs").json()["data"] == []
    upload(code_client, package.data)
    run = code_client.post(f"{API}/runs", json=imported_run(example_body, package.digest))
    assert run.status_code == 201, run.text
    assert run.json()["spec"]["model"] == {"import": "my_project.nets:build", "params": {"width": 8}}
    assert run.json()["spec"]["code"] == {"digest": package.digest}


def test_code_requirements_are_parsed_at_submit_and_kept_with_the_spec(code_client, example_body, package):
    upload(code_client, package.data)
    body = imported_run(example_body, package.digest)
    bad = code_client.post(f"{API}/runs", json={**body, "code": {"digest": package.digest,
                                                                 "requirements": ["einops==0.8.1", "--index-url x"]}})
    assert bad.status_code == 422
    [item] = bad.json()["detail"]
    assert item["field"] == "code.requirements[1]" and item["input"] == "--index-url x"
    assert "is a pip option" in item["msg"] and "einops==0.8.1" in item["msg"]  # what is allowed
    assert code_client.get(f"{API}/runs").json()["data"] == []
    good = code_client.post(f"{API}/runs", json={**body, "code": {"digest": package.digest,
                                                                  "requirements": [" einops==0.8.1", "scipy>=1.11,<2"]}})
    assert good.status_code == 201, good.text
    assert good.json()["spec"]["code"] == {"digest": package.digest, "requirements": ["einops==0.8.1", "scipy>=1.11,<2"]}


# Every module of a zip_of package: NETS, and the other callables the tests import.
STUB_MODULE = NETS + "\n\ndef char_windows(size):\n    return []\n\n\ntrain_set = test_set = tokens = char_windows\n"


def zip_of(*names: str) -> bytes:
    return zip_of_sources(dict.fromkeys(names, STUB_MODULE))


def test_a_model_import_the_package_does_not_hold_is_refused_naming_what_it_holds(code_client, example_body,
                                                                                   package, sweep_body):
    upload(code_client, package.data)
    body = {**imported_run(example_body, package.digest), "model": {"import": "nets_pkg.nets:build"}}
    response = code_client.post(f"{API}/runs", json=body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["loc"], item["input"]) == ("model.import", ["body", "model", "import"],
                                                           "nets_pkg.nets:build")
    assert item["msg"] == (f"the code package {package.digest[:12]} (code.digest) holds no top-level package or module "
                           "'nets_pkg'; it holds: my_project. Import from one of those (e.g. "
                           "'my_project.module:callable' for a package, 'my_project:callable' for a module), or pack "
                           "the folder that holds nets_pkg (tessera submit --code DIR)")
    sweep = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": body, "search": {}})
    assert sweep.status_code == 422
    assert [(i["field"], i["input"]) for i in sweep.json()["detail"]] == [("base.model.import", "nets_pkg.nets:build")]
    assert code_client.get(f"{API}/runs").json()["data"] == [] and code_client.get(f"{API}/sweeps").json()["data"] == []


def test_a_searched_import_the_package_does_not_hold_is_refused_naming_the_value(code_client, example_body,
                                                                                  package, sweep_body):
    """A sweep's trials get each value of a searched import: every one is checked as the base's is,
    and the error names the search parameter and the value (a trial would fail on its worker)."""
    upload(code_client, package.data)
    base = {**imported_run(example_body, package.digest), "model": {"import": "my_project.nets:build"}}
    search = {"params": {"model.import": {"choice": ["my_project.nets:build", "nets_pkg.nets:build"]}}}
    sweep = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": base, "search": search})
    assert sweep.status_code == 422, sweep.text
    [item] = sweep.json()["detail"]
    assert (item["field"], item["loc"], item["input"]) == (
        "search.params['model.import'].choice", ["body", "search", "params", "model.import", "choice"],
        "nets_pkg.nets:build")
    assert "holds no top-level package or module 'nets_pkg'; it holds: my_project" in item["msg"]
    assert code_client.get(f"{API}/sweeps").json()["data"] == []
    # Every trial takes a searched value in the base's place: a base import the package lacks is
    # no problem when each searched one is held.
    base["model"]["import"] = "nets_pkg.nets:build"
    search["params"]["model.import"]["choice"] = ["my_project.nets:build", "my_project.nets:build_wide"]
    accepted = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": base, "search": search})
    assert accepted.status_code == 201, accepted.text
    # The package itself is not searched: its imports are checked against the base's digest.
    search["params"] = {"code.digest": {"choice": [package.digest, "0" * 64]}}
    refused = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": base, "search": search})
    assert refused.status_code == 422
    assert "the code package cannot be searched" in refused.text


@pytest.mark.parametrize(("files", "target"), [
    (["my_project/__init__.py", "my_project/nets.py"], "my_project.nets:build"),
    (["single.py"], "single:build"),
    (["helpers.py", "src/models/net.py"], "src.models.net:build"),  # src: a namespace package (no __init__.py)
    # Below a held package, as import would find the module:
    (["my_project/__init__.py", "my_project/text/__init__.py"], "my_project.text:build"),
    (["my_project/__init__.py", "my_project/text/windows.py"], "my_project.text:char_windows"),  # a namespace package
    (["my_project/__init__.py", "my_project/text/windows.py"], "my_project.text.windows:char_windows"),
    (["my_project/__init__.py", "my_project/assets/corpus.txt"], "my_project.assets:load"),  # a folder: imported too
    (["my_project/__init__.py", "my_project/fast.cpython-312-x86_64-linux-gnu.so"], "my_project.fast:build"),
    (["my_project/__init__.py", "my_project/nets/__init__.py", "my_project/nets/deep.py"],
     "my_project.nets.deep:build"),
    # Below a namespace package (a folder without __init__), nothing is checked: Python merges its
    # portions from every folder on sys.path, so src.model may be installed on the workers.
    (["helpers.py", "src/models/net.py"], "src.model.net:build"),
])
def test_a_model_import_the_package_holds_is_accepted(code_client, example_body, files, target):
    data = zip_of(*files)
    assert upload(code_client, data).status_code == 201
    body = {**imported_run(example_body, sha256_hex(data)), "model": {"import": target}}
    response = code_client.post(f"{API}/runs", json=body)
    assert response.status_code == 201, response.text


def refused_imports(code_client, example_body, data: bytes, *, model: str, train: str) -> tuple[dict, list[dict]]:
    """Upload ``data``, submit a run importing ``model`` and training on ``train`` from it (each
    with the parameters the stubs take), and return (the body sent, the 422's items)."""
    upload(code_client, data)
    body = with_own_data(imported_run(example_body, sha256_hex(data)), train={"import": train, "params": {"size": 64}})
    body["model"]["import"] = model
    refused = code_client.post(f"{API}/runs", json=body)
    assert refused.status_code == 422, refused.text
    return body, refused.json()["detail"]


TEXT_PROJECT = ("my_project/__init__.py", "my_project/data.py", "my_project/nets.py", "my_project/text.py",
                "my_project/corpus.txt")


def test_an_import_of_a_module_the_package_does_not_hold_is_refused_naming_what_it_holds(code_client, example_body,
                                                                                         sweep_body):
    """The top-level package is there but the module below it is not (a typo): the workers'
    import would fail, so the submit does, naming the field, the value, the modules held and
    the closest one. Only the zip's file names are read for this."""
    data = zip_of(*TEXT_PROJECT)
    digest = sha256_hex(data)
    body, items = refused_imports(code_client, example_body, data, model="my_project.netz:build",
                                  train="my_project.textz:char_windows")
    assert [(i["field"], i["loc"], i["input"]) for i in items] == [
        ("model.import", ["body", "model", "import"], "my_project.netz:build"),
        ("data.train.import", ["body", "data", "train", "import"], "my_project.textz:char_windows")]
    assert items[1]["msg"] == (
        f"the code package {digest[:12]} (code.digest) holds no module 'my_project.textz' (neither "
        "my_project/textz.py nor my_project/textz/__init__.py nor a folder my_project/textz/); my_project holds: "
        "my_project.data, my_project.nets, my_project.text. Did you mean 'my_project.text:char_windows'?")
    assert items[0]["msg"].endswith("Did you mean 'my_project.nets:build'?")
    assert code_client.get(f"{API}/runs").json()["data"] == []

    # A sweep's base goes through the same check, its fields under base.; so do searched imports.
    sweep = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": body, "search": {}})
    assert sweep.status_code == 422
    assert [(i["field"], i["input"]) for i in sweep.json()["detail"]] == [
        ("base.model.import", "my_project.netz:build"), ("base.data.train.import", "my_project.textz:char_windows")]
    body["model"]["import"] = body["data"]["train"]["import"] = "my_project.nets:build"
    search = {"params": {"model.import": {"choice": ["my_project.nets:build", "my_project.nets_v2:build"]}}}
    searched = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": body, "search": search})
    assert searched.status_code == 422
    [item] = searched.json()["detail"]
    assert (item["field"], item["input"]) == ("search.params['model.import'].choice", "my_project.nets_v2:build")
    assert "holds no module 'my_project.nets_v2'" in item["msg"]
    assert item["msg"].endswith("Did you mean 'my_project.nets:build'?")
    assert code_client.get(f"{API}/sweeps").json()["data"] == []

    # The module held, its source binds the callable: accepted.
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, accepted.text


TEXT_SOURCE = ("import torch\n\nSEQ = 64\n\n\ndef char_windows(size):\n    return []\n\n\n"
               "class Corpus:\n    pass\n\n\ndef _helper():\n    pass\n")


def test_a_callable_the_modules_source_does_not_bind_is_refused_naming_what_it_binds(code_client, example_body,
                                                                                     sweep_body):
    """The module is there, but its source binds no such name at its top level: the workers'
    getattr would fail, so the submit does. The source is parsed, not run."""
    data = zip_of_sources({"my_project/__init__.py": "", "my_project/text.py": TEXT_SOURCE,
                           "my_project/nets.py": NETS, "my_project/data.py": "test_set = list\n",
                           "my_project/magic.py": "from torch.nn import *\n"})
    digest = sha256_hex(data)
    body, items = refused_imports(code_client, example_body, data, model="my_project.nets:biuld",
                                  train="my_project.text:char_windowz")
    assert [(i["field"], i["input"]) for i in items] == [("model.import", "my_project.nets:biuld"),
                                                         ("data.train.import", "my_project.text:char_windowz")]
    assert items[1]["msg"] == (
        f"the code package {digest[:12]} (code.digest) has no 'char_windowz' at the top level of my_project/text.py "
        "(it defines: Corpus, SEQ, char_windows, torch); did you mean 'my_project.text:char_windows'?")
    assert items[0]["msg"].endswith("did you mean 'my_project.nets:build'?")
    # The same check for a sweep's base and its searched imports.
    base = {**body, "model": {"import": "my_project.nets:build"}}
    search = {"params": {"data.train.import": {"choice": ["my_project.text:char_windows", "my_project.text:Corpuz"]}}}
    searched = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": base, "search": search})
    assert searched.status_code == 422
    [item] = searched.json()["detail"]
    assert item["input"] == "my_project.text:Corpuz" and "did you mean 'my_project.text:Corpus'?" in item["msg"]
    # A module whose names a parse cannot know (a star import) is the workers' to check.
    body["model"]["import"], body["data"]["train"]["import"] = "my_project.magic:Linear", "my_project.text:char_windows"
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, accepted.text


@pytest.mark.parametrize(("files", "target", "message"), [
    (["my_project/__init__.py", "my_project/nets.py"], "my_project.nets.wide:build",
     "holds 'my_project.nets' as a module, not a package, so it holds no module 'my_project.nets.wide'; name a "
     "callable of that module as 'my_project.nets:callable'"),
    (["single.py"], "single.nets:build",
     "holds 'single' as a module, not a package, so it holds no module 'single.nets'"),
    (["my_project/__init__.py", "my_project/models/__init__.py", "my_project/models/resnet.py"],
     "my_project.models.resnett:build", "my_project.models holds: my_project.models.resnet. Did you mean "
     "'my_project.models.resnet:build'?"),
    (["helpers.py", "src/models/__init__.py", "src/models/net.py"], "src.models.nett:build",  # below a namespace
     "src.models holds: src.models.net. Did you mean 'src.models.net:build'?"),
    (["my_project/__init__.py", "my_project/nets.py", "my_project/__pycache__/text.cpython-312.pyc"],
     "my_project.text:build", "nor a folder my_project/text/); my_project holds: my_project.nets"),  # no .pyc cache
    (["my_project/__init__.py", *(f"my_project/m{i:02}.py" for i in range(25))], "my_project.other:build",
     "my_project holds: my_project.m00, my_project.m01, "),
], ids=["a_module_not_a_package", "a_top_level_module", "a_subpackage", "below_a_namespace_s_package",
        "no_pyc_cache", "a_long_listing"])
def test_a_module_below_a_held_package_is_checked_as_import_would_find_it(code_client, example_body, files, target,
                                                                           message):
    data = zip_of(*files)
    assert upload(code_client, data).status_code == 201
    body = {**imported_run(example_body, sha256_hex(data)), "model": {"import": target}}
    response = code_client.post(f"{API}/runs", json=body)
    assert response.status_code == 422, response.text
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == ("model.import", target)
    assert item["msg"].startswith(f"the code package {sha256_hex(data)[:12]} (code.digest) ") and message in item["msg"]
    assert "__pycache__" not in item["msg"]
    if len(files) > 20:  # a long listing is cut, and nothing close is guessed
        assert item["msg"].endswith("my_project.m19 and 5 more") and "m20" not in item["msg"]


MODEL_ERRORS = {
    "unknown_arch": ({"name": "torchvision", "arch": "resnet5"}, "model.arch", "resnet5",
                     "close names: resnet50, resnet152"),
    "weights": ({"name": "torchvision", "arch": "resnet50", "params": {"weights": "IMAGENET1K_V2"}}, "model.params",
                {"weights": "IMAGENET1K_V2"}, "random weights"),
    "stem_in_params": ({"name": "torchvision", "arch": "resnet50", "params": {"small_input_stem": True}},
                       "model.params", {"small_input_stem": True}, "a field of the model, not an argument"),
    "bad_import": ({"import": "my-project/nets.py"}, "model.import", "my-project/nets.py",
                   "'package.module:callable'"),
    "reserved_param": ({"import": "my_project.nets:build", "params": {"num_classes": 3}}, "model.params",
                       {"num_classes": 3}, "'num_classes'"),
}


@pytest.mark.parametrize("case", MODEL_ERRORS)
def test_model_specs_are_checked_at_submit(code_client, example_body, case):
    model, field, value, hint = MODEL_ERRORS[case]
    example_body.update(model=model, algorithms=[])
    response = code_client.post(f"{API}/runs", json=example_body)
    assert response.status_code == 422
    [item] = response.json()["detail"]
    assert (item["field"], item["input"]) == (field, value) and hint in item["msg"]


def test_a_torchvision_arch_is_accepted_and_listed_in_the_catalog(code_client, example_body):
    example_body["model"] = {"name": "torchvision", "arch": "resnet50"}
    assert code_client.post(f"{API}/runs", json=example_body).status_code == 201
    [entry] = [e for e in code_client.get(f"{API}/models").json()["data"] if e["name"] == "torchvision"]
    assert "resnet50" in entry["params_schema"]["properties"]["arch"]["enum"]


def test_the_sdk_uploads_a_folder_once_and_records_its_digest(code_client, example_body, tmp_path, monkeypatch):
    from api.client import Client

    root = stub_project(tmp_path)
    sdk = Client("http://testserver")
    sdk._http = code_client  # the TestClient is an httpx.Client on the app
    calls = []
    original = code_client.request
    monkeypatch.setattr(code_client, "request",
                        lambda method, url, *a, **kw: calls.append((method, str(url).split("?")[0]))
                        or original(method, url, *a, **kw))
    body = {**example_body, "model": {"import": "my_project.nets:build"}, "algorithms": []}
    first = sdk.create_run(body, code=root)
    second = sdk.create_run(body, code=str(root))
    digest = pack_directory(root).digest
    assert first.spec["code"] == second.spec["code"] == {"digest": digest}
    code_calls = [call for call in calls if "/code" in call[1]]
    assert code_calls == [("HEAD", f"{API}/code/{digest}"), ("POST", f"{API}/code"),  # uploaded once
                          ("HEAD", f"{API}/code/{digest}")]                            # then only checked
    assert sdk.has_code(digest) and sdk.get_code(digest).top_level == ["my_project"]
    assert sdk.get_code("f" * 64) is None
    stored = list((tmp_path / "storage" / "code").iterdir())
    assert [p.name for p in stored] == [f"{digest}.zip"]
    needing = sdk.create_run({**body, "code": {"requirements": ["einops==0.8.1"]}}, code=root)
    assert needing.spec["code"] == {"requirements": ["einops==0.8.1"], "digest": digest}  # code= kept them


# --- downloading a package back (GET /code/{digest}/package, Client.download_code) ----------

def test_a_stored_package_downloads_byte_for_byte_and_an_unknown_one_is_a_404(code_client, package):
    missing = code_client.get(f"{API}/code/{package.digest}/package")
    assert missing.status_code == 404 and missing.json() == {"detail": f"no code package {package.digest}"}
    assert upload(code_client, package.data).status_code == 201
    answer = code_client.get(f"{API}/code/{package.digest}/package")
    assert answer.status_code == 200
    assert answer.content == package.data and sha256_hex(answer.content) == package.digest
    assert answer.headers["content-type"] == "application/zip"
    assert answer.headers["content-length"] == str(len(package.data))
    assert answer.headers["content-disposition"] == f'attachment; filename="{package.digest}.zip"'
    malformed = code_client.get(f"{API}/code/not-a-sha/package")
    assert malformed.status_code == 422 and malformed.json()["detail"]


def test_only_keys_with_a_role_in_the_packages_project_download_it_as_the_other_code_routes_answer(
        code_client, package):
    def project(name: str) -> str:
        assert code_client.post(f"{API}/projects", json={"name": name}).status_code == 201
        return name

    def key(project_name: str, role: str) -> dict[str, str]:
        made = code_client.post(f"{API}/keys", json={"project": project_name, "role": role, "name": role})
        assert made.status_code == 201, made.text
        return {"Authorization": f"Bearer {made.json()['key']}"}

    a, b = project(f"code-a-{uuid.uuid4().hex[:8]}"), project(f"code-b-{uuid.uuid4().hex[:8]}")
    viewer_a, member_b = key(a, "viewer"), key(b, "member")
    assert upload_to(code_client, package.data, a).status_code == 201
    path = f"{API}/code/{package.digest}"
    for headers, params, expected in [(viewer_a, {}, 200),              # a viewer's only project: A
                                      (viewer_a, {"project": a}, 200),
                                      (member_b, {"project": a}, 404),  # no role in A: as if A did not exist
                                      (member_b, {}, 404)]:             # B holds no such package
        answer = code_client.get(f"{path}/package", params=params, headers=headers)
        assert answer.status_code == expected, (headers, params, answer.text)
        assert code_client.get(path, params=params, headers=headers).status_code == expected  # as GET /code/{digest}
        assert code_client.head(path, params=params, headers=headers).status_code == expected
        if expected == 200:
            assert answer.content == package.data
        else:
            assert answer.json()["detail"] and package.data not in answer.content
    assert code_client.get(f"{path}/package", params={"project": a}).content == package.data  # the admin's


def upload_to(client, data: bytes, project: str):
    return client.post(f"{API}/code", params={"digest": sha256_hex(data), "project": project}, content=data,
                       headers={"Content-Type": "application/zip"})


@pytest.fixture
def sdk(code_client):
    from api.client import Client

    client = Client("http://testserver")
    client._http = code_client  # the TestClient is an httpx.Client on the app
    return client


def test_download_code_writes_the_package_whole_or_not_at_all(code_client, sdk, package, tmp_path, monkeypatch):
    from api.code_package import CodePackageError
    from api.errors import ApiError
    from service.code_store import CodeStore

    out = tmp_path / "out" / "pkg.zip"
    out.parent.mkdir()
    with pytest.raises(ApiError) as missing:
        sdk.download_code(package.digest, out)
    assert missing.value.status_code == 404 and list(out.parent.iterdir()) == []
    upload(code_client, package.data)
    assert sdk.download_code(package.digest, out) == len(package.data) and out.read_bytes() == package.data

    out.write_bytes(b"the previous file")
    original = CodeStore.chunks
    monkeypatch.setattr(CodeStore, "chunks",  # the store's answer ends halfway (a connection cut short)
                        lambda self, digest, *a: iter([b"".join(original(self, digest))[:len(package.data) // 2]]))
    with pytest.raises(CodePackageError, match=f"sha256 is [0-9a-f]{{64}} .cut short or changed.; nothing written"):
        sdk.download_code(package.digest, out)
    assert out.read_bytes() == b"the previous file"  # untouched, and no partial file left beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["pkg.zip"]


# --- sweeps over your own model -------------------------------------------------------------

def test_a_sweep_with_code_records_it_in_the_base_and_every_trial_inherits_it(code_client, sdk, example_body,
                                                                               tmp_path):
    from api.errors import InvalidInput
    from api.sweeps import SweepSpec, trial_spec

    root = stub_project(tmp_path)
    digest = pack_directory(root).digest
    base = {**example_body, "model": {"import": "my_project.nets:build", "params": {"width": 8}}, "algorithms": []}
    body = {"name": "byo-sweep", "base": base, "search": {"params": {"optimizer.lr": {"grid": [0.05, 0.1]}}}}

    refused = code_client.post(f"{API}/sweeps", json={**body, "base": {**base, "code": {"digest": digest}}})
    assert refused.status_code == 422  # POST /sweeps checks the base's package as POST /runs does
    [item] = refused.json()["detail"]
    assert item["field"] == "base.code.digest" and item["input"] == digest and "upload it first" in item["msg"]

    sweep = sdk.create_sweep(body, code=root)
    assert sweep.spec["base"]["code"] == {"digest": digest}
    assert "code" not in body["base"]  # the caller's dict is left as it was
    assert (tmp_path / "storage" / "code" / f"{digest}.zip").is_file()
    spec = SweepSpec.model_validate(sweep.spec)
    trials = [trial_spec(spec.base, (), {"optimizer.lr": lr}, name=f"t{lr}") for lr in (0.05, 0.1)]
    assert [t.code.digest for t in trials] == [digest, digest]  # what workers.tune.trial trains and installs
    assert sdk.create_sweep(body, code=str(root)).spec["base"]["code"] == {"digest": digest}  # not uploaded again
    needing = {**body, "base": {**base, "code": {"requirements": ["einops==0.8.1"]}}}
    spec = SweepSpec.model_validate(sdk.create_sweep(needing, code=root).spec)
    assert spec.base.code.requirements == ["einops==0.8.1"]  # code= kept them, and every trial has them:
    assert trial_spec(spec.base, (), {"optimizer.lr": 0.05}, name="t").code.requirements == ["einops==0.8.1"]

    with pytest.raises(InvalidInput) as no_base:
        sdk.create_sweep({"name": "no-base"}, code=root)
    [item] = no_base.value.detail
    assert item["field"] == "base" and item["input"] is None and "base RunSpec, a mapping" in item["msg"]


OWN_DATA = {"train": {"import": "my_project.data:train_set", "params": {"size": 64}},
            "eval": {"import": "my_project.data:test_set", "num_classes": 4}}


def with_own_data(body: dict, **data) -> dict:
    return {**body, "data": {**body["data"], **OWN_DATA, **data}}


@pytest.fixture
def data_package(tmp_path):
    """The stub project with ``my_project/data.py`` too: the module ``OWN_DATA`` imports from."""
    root = stub_project(tmp_path)
    (root / "data.py").write_text("def train_set(size):\n    return []\n\n\ntest_set = tokens = train_set\n")
    return pack_directory(root)


def test_your_own_data_set_is_checked_against_the_package_like_a_model_import(code_client, example_body,
                                                                               data_package, sweep_body):
    package = data_package
    upload(code_client, package.data)
    body = with_own_data(imported_run(example_body, package.digest))
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["data"]["train"]["import"] == "my_project.data:train_set"
    missing = with_own_data(body, train={"import": "datasets_pkg.data:train_set"},
                            eval={"import": "other.data:test_set"})
    refused = code_client.post(f"{API}/runs", json=missing)
    assert refused.status_code == 422
    items = refused.json()["detail"]
    assert [(i["field"], i["loc"], i["input"]) for i in items] == [
        ("data.train.import", ["body", "data", "train", "import"], "datasets_pkg.data:train_set"),
        ("data.eval.import", ["body", "data", "eval", "import"], "other.data:test_set")]
    assert items[0]["msg"] == (f"the code package {package.digest[:12]} (code.digest) holds no top-level package or "
                               "module 'datasets_pkg'; it holds: my_project. Import from one of those (e.g. "
                               "'my_project.module:callable' for a package, 'my_project:callable' for a module), or "
                               "pack the folder that holds datasets_pkg (tessera submit --code DIR)")
    sweep = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": missing, "search": {}})
    assert sweep.status_code == 422
    assert [i["field"] for i in sweep.json()["detail"]] == ["base.data.train.import", "base.data.eval.import"]


def test_your_own_token_data_is_a_text_run_that_may_be_swept_on_perplexity(code_client, example_body,
                                                                             data_package, sweep_body):
    """task: language_model makes a run text data: a text model, times in tokens, perplexity."""
    package = data_package
    upload(code_client, package.data)
    tokens = {"import": "my_project.data:tokens", "task": "language_model", "seq_len": 16}
    body = {**imported_run(example_body, package.digest), "max_duration": "4096tok",
            "model": {"name": "gpt_small", "params": {"n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 32}},
            "data": {"train": tokens, "eval": tokens, "batch_size": 8}, "optimizer": {"name": "adamw", "lr": 0.003}}
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["data"]["train"]["task"] == "language_model"
    sweep = code_client.post(f"{API}/sweeps", json={**sweep_body, "base": body, "metric": "eval/perplexity",
                                                      "mode": "min", "search": {"params": {"optimizer.lr": {
                                                          "grid": [0.003, 0.01]}}}})
    assert sweep.status_code == 201, sweep.text
    vision = code_client.post(f"{API}/runs", json={**body, "model": {"name": "simple_cnn"}})
    assert vision.status_code == 422
    assert "your own data set of task language_model is text data" in vision.text


def test_a_data_import_without_code_is_taken_as_a_model_import_is(code_client, example_body):
    """Neither names a package: the workers import from their own packages (as ``model.import`` does)."""
    body = with_own_data({**example_body, "algorithms": []})
    response = code_client.post(f"{API}/runs", json=body)
    assert response.status_code == 201, response.text
    model_only = {**example_body, "model": {"import": "my_project.nets:build"}, "algorithms": []}
    assert code_client.post(f"{API}/runs", json=model_only).status_code == 201


@pytest.mark.parametrize(("data", "field", "hint"), [
    ({"eval": {"name": "digits", "split": "test"}}, "data.eval",
     "data.eval is the named data set 'digits' but data.train is your own (import)"),
    ({"train": {"import": "my_project.data:train_set", "shuffle": True}}, "data.train",
     "unknown field(s) 'shuffle' next to 'import'"),
    ({"train": {"import": "my_project/data.py"}}, "data.train.import", "'package.module:callable'"),
    ({"train": {"import": "my_project.data:train_set", "num_classes": 0}}, "data.train.num_classes",
     "greater than or equal to 1"),
])
def test_your_own_data_set_specs_are_checked_at_submit(code_client, example_body, data, field, hint):
    response = code_client.post(f"{API}/runs", json=with_own_data({**example_body, "algorithms": []}, **data))
    assert response.status_code == 422
    assert any(i["field"] == field and hint in i["msg"] for i in response.json()["detail"]), response.json()


@pytest.mark.parametrize(("files", "why"), [
    ({"my_project/__init__.py": "", "my_project/nets.py": "x = 1\n",
      "my_project/nets.cpython-311-x86_64-linux-gnu.so": "binary"}, "an extension module beside it: imported first"),
    ({"my_project/__init__.py": "", "my_project/nets.py": "x = 1\n", "./my_project/nets.py": "def build(): pass\n"},
     "two entries unpack to one file: which one lands is the unpacker's"),
])
def test_a_source_the_workers_might_not_import_is_not_judged(code_client, example_body, files, why):
    data = zip_of_sources(files)
    assert upload(code_client, data).status_code == 201
    body = {**imported_run(example_body, sha256_hex(data)), "model": {"import": "my_project.nets:build"}}
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, (why, accepted.text)


def test_a_package_whose_module_cannot_be_decompressed_is_let_through_not_a_500(code_client, example_body):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("my_project/__init__.py", "")
        archive.writestr("my_project/nets.py", "def build(num_classes, in_channels):\n    return None\n" * 50)
    data = bytearray(buffer.getvalue())
    start = data.index(b"my_project/nets.py") + len("my_project/nets.py")  # the local header's name, then the data
    data[start + 10:start + 40] = b"\xff" * 30  # corrupt deflate data: the directory still reads
    assert upload(code_client, bytes(data)).status_code == 201
    body = {**imported_run(example_body, sha256_hex(bytes(data))), "model": {"import": "my_project.nets:build"}}
    response = code_client.post(f"{API}/runs", json=body)
    assert response.status_code == 201, response.text  # the workers' unpacking says what is wrong


def test_your_own_eval_metric_is_checked_against_the_package_and_built_in_ones_by_name(code_client, example_body,
                                                                                        package):
    """``eval_metrics``: an import is checked like a model's (file names and a parse, never run);
    a built-in's name, the eval set it needs and what text data allows are checked with the spec."""
    upload(code_client, package.data)
    body = imported_run(example_body, package.digest)
    body["eval_metrics"] = ["f1_macro", {"import": "my_project.nets:build_wide"}]  # the service never calls it
    accepted = code_client.post(f"{API}/runs", json=body)
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["eval_metrics"] == ["f1_macro", {"import": "my_project.nets:build_wide",
                                                                     "params": {}}]
    body["eval_metrics"] = ["auroc", {"import": "my_project.metricz:pr_auc"}, {"import": "my_project.nets:aucc"}]
    refused = code_client.post(f"{API}/runs", json=body)
    assert refused.status_code == 422
    items = refused.json()["detail"]
    assert [(i["field"], i["input"]) for i in items] == [("eval_metrics[1].import", "my_project.metricz:pr_auc"),
                                                         ("eval_metrics[2].import", "my_project.nets:aucc")]
    assert "holds no module 'my_project.metricz'" in items[0]["msg"]
    assert "has no 'aucc' at the top level of my_project/nets.py" in items[1]["msg"]
    body["eval_metrics"] = ["f1", "auroc", "auroc"]
    items = code_client.post(f"{API}/runs", json=body).json()["detail"]
    assert [(i["field"], i["input"]) for i in items] == [("eval_metrics[0]", "f1"), ("eval_metrics[2]", "auroc")]
    assert "'f1' is not a built-in evaluation metric; close names: f1_macro" in items[0]["msg"]
    assert "listed twice" in items[1]["msg"]  # in the same 422, not the next submit's
    body["eval_metrics"] = ["auroc", "auroc"]
    [item] = code_client.post(f"{API}/runs", json=body).json()["detail"]
    assert item["field"] == "eval_metrics[1]" and "listed twice" in item["msg"]
    without_eval = copy.deepcopy(body)
    without_eval["eval_metrics"] = ["auroc"]
    without_eval["data"].pop("eval")
    [item] = code_client.post(f"{API}/runs", json=without_eval).json()["detail"]
    assert item["field"] == "data.eval" and "eval_metrics are computed on an eval data set" in item["msg"]
    assert len(code_client.get(f"{API}/runs").json()["data"]) == 1  # only the first
