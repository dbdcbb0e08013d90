"""What the service serves for the dashboard, without a browser: the page and its assets, the
vendored libraries as recorded, method cards, and ETag revalidation of the runs views."""

from __future__ import annotations

import hashlib
import re

import pytest
import yaml
from fastapi.testclient import TestClient

from api import catalog as api_catalog
from api.method_cards import card_file_name
from service.dashboard import STATIC_DIR
from service.routes import catalog as catalog_routes
from tests.conftest import ADMIN_HEADERS
from tests.dashboard.conftest import IdleJobs

API = "/api/v1"
EXAMPLE = yaml.safe_load((STATIC_DIR.parents[2] / "examples" / "digits_resnet.yaml").read_text())
OWN_FILES = [STATIC_DIR / "index.html", *sorted((STATIC_DIR / "css").glob("*.css")),
             *sorted((STATIC_DIR / "js").glob("*.js"))]


@pytest.fixture
def client(tmp_path):
    from service.app import create_app
    from service.settings import Settings

    app = create_app(Settings(home=tmp_path / "home", public_url="http://tessera.test:8000"),
                     jobs=IdleJobs(), run_dispatcher=False)
    with TestClient(app, headers=ADMIN_HEADERS) as test_client:
        yield test_client


def test_the_dashboard_is_served_at_root_and_every_asset_it_names_resolves(client):
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/js/app.js">' in index.text
    assert index.headers["cache-control"] == "no-cache"
    assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', index.text)
    assert len(assets) >= 3
    # ES module imports are relative paths between static files: each must exist.
    for module in (STATIC_DIR / "js").glob("*.js"):
        for target in re.findall(r'^\s*import\b[^;]*?from\s+"([^"]+)"', module.read_text(), flags=re.M | re.S):
            resolved = (module.parent / target).resolve()
            assert resolved.is_file(), f"{module.name} imports {target}, which does not exist"
            assets.append("/static/" + resolved.relative_to(STATIC_DIR).as_posix())
    for asset in assets:
        response = client.get(asset)
        assert response.status_code == 200, asset
        assert response.headers["cache-control"] == "no-cache", asset
    assert client.get("/static/js/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/nope.js").status_code == 404


def test_the_dashboard_loads_nothing_from_other_hosts():
    remote = re.compile(r"""(?:src|href)\s*=\s*["']\s*(?:https?:)?//"""  # <script src=, <link href=
                        r"""|import[^;]*?from\s+["'](?:https?:)?//"""  # an ES module from another host
                        r"""|url\(\s*["']?(?:https?:)?//""")  # CSS url()
    offenders = {f.name: remote.findall(f.read_text()) for f in OWN_FILES}
    assert {name: hits for name, hits in offenders.items() if hits} == {}


def test_the_api_docs_page_loads_swagger_ui_from_the_service_itself(client):
    """FastAPI's own docs page loads Swagger UI from cdn.jsdelivr.net: blank without internet."""
    page = client.get(f"{API}/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assets = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", page.text)
    assert {"/static/vendor/swagger-ui-bundle.js", "/static/vendor/swagger-ui.css", f"{API}/openapi.json"} <= set(assets)
    assert not [asset for asset in assets if "//" in asset], assets  # nothing from another host
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_vendored_libraries_are_the_recorded_versions_with_their_licenses():
    vendor = STATIC_DIR / "vendor"
    manifest = (vendor / "VENDOR.md").read_text()
    recorded = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", manifest, flags=re.M))
    code = {p.name for p in vendor.iterdir() if p.suffix in (".js", ".mjs", ".css", ".png")}
    assert set(recorded) == code, "every vendored file, and only those, has a recorded sha256"
    for name, digest in recorded.items():
        actual = hashlib.sha256((vendor / name).read_bytes()).hexdigest()
        assert actual == digest, f"{name} differs from the recorded copy"
    for package, version in {"uplot": "1.6.32", "js-yaml": "5.5.0", "marked": "18.2.1", "dompurify": "3.5.0",
                             "swagger-ui-dist": "5.36.0"}.items():
        assert re.search(rf"\| {re.escape(package)} \| {re.escape(version)} \|", manifest), package
        assert (vendor / f"LICENSE.{package.removesuffix('-dist')}").is_file(), f"{package}'s license is not shipped"
    assert "uPlot (v1.6.32)" in (vendor / "uPlot.esm.js").read_text()[:400]
    assert "js-yaml 5.5.0" in (vendor / "js-yaml.mjs").read_text()[:200]
    assert "marked v18.2.1" in (vendor / "marked.esm.js").read_text()[:200]
    assert "DOMPurify 3.5.0" in (vendor / "purify.es.mjs").read_text()[:300]


# --- method cards --------------------------------------------------------------------------

def test_method_cards_are_the_api_packages_card_files(client):
    served = 0
    for name in api_catalog.ALGORITHMS:
        readme = catalog_routes.CARDS.joinpath(card_file_name(name))
        response = client.get(f"{API}/algorithms/{name}/card")
        if readme.is_file():
            assert response.status_code == 200, name
            assert response.headers["content-type"].startswith("text/markdown")
            assert response.text == readme.read_text(encoding="utf-8")
            served += 1
        else:
            assert response.status_code == 404, name
    assert served >= 1, "no algorithm has a method card to serve"


def test_a_missing_method_card_is_a_clean_404(client, tmp_path, monkeypatch):
    name = next(iter(api_catalog.ALGORITHMS))
    monkeypatch.setattr(catalog_routes, "CARDS", tmp_path / "no-cards-here")
    response = client.get(f"{API}/algorithms/{name}/card")
    assert response.status_code == 404
    assert response.json() == {"detail": f"algorithm {name!r} has no method card yet"}


@pytest.mark.parametrize("name", ["no_such_method", "..", "base.py", "registry", "cutmix%2F..%2F..%2Fpyproject.toml"])
def test_only_catalog_names_reach_the_file_system(client, name):
    response = client.get(f"{API}/algorithms/{name}/card")
    assert response.status_code == 404
    assert "not found" in response.json()["detail"] or response.json()["detail"] == "Not Found"


# --- ETag / If-None-Match on the runs views ---------------------------------------------------

def _create(client, name: str) -> dict:
    response = client.post(f"{API}/runs", json={**EXAMPLE, "name": name})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.mark.parametrize("path", ["/runs", "/runs?status=QUEUED&limit=10", "/runs/{id}"])
def test_runs_views_answer_304_while_unchanged_and_200_once_changed(client, path):
    run = _create(client, "first")
    url = API + path.format(id=run["id"])
    first = client.get(url)
    etag = first.headers["etag"]
    assert first.status_code == 200 and etag.startswith('"') and first.headers["cache-control"] == "no-cache"

    again = client.get(url, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    assert client.get(url, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert client.get(url, headers={"If-None-Match": '"something-else"'}).status_code == 200

    # A change the view shows gives a new ETag and a full answer.
    if "{id}" in path:
        assert client.post(f"{API}/runs/{run['id']}/cancel").status_code == 200
    else:
        _create(client, "second")
    changed = client.get(url, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json() != first.json()


def test_conditional_answers_carry_the_same_json_as_before(client):
    run = _create(client, "same-body") | {"replayed": None}  # only a create's answer says whether it made the run
    assert client.get(f"{API}/runs/{run['id']}").json() == run
    assert client.get(f"{API}/runs").json() == {"data": [run], "next_cursor": None}


def test_the_openapi_document_says_which_operations_need_a_key_as_the_routes_answer(client):
    """Bearer by default (the docs page's Authorize button sends the key); the routes that answer
    without a key say so. Each GET without path parameters is tried without a key to hold the
    document to what the routes do."""
    schema = client.get(f"{API}/openapi.json").json()
    bearer = schema["components"]["securitySchemes"]["bearer"]
    assert bearer == {"type": "http", "scheme": "bearer", "description": bearer["description"]}
    assert schema["security"] == [{"bearer": []}]
    open_ops = sorted(op["operationId"] for ops in schema["paths"].values() for op in ops.values()
                      if op.get("security") == [])
    assert open_ops == ["get_algorithm_card", "healthz", "list_algorithms", "list_datasets", "list_models"]
    keyless = TestClient(client.app)  # no Authorization header
    for path, operations in schema["paths"].items():
        if "get" in operations and "{" not in path:
            status = keyless.get(path).status_code
            assert (status == 401) == (operations["get"].get("security") != []), (path, status)
