"""Static checks of docker-compose.yml, the Dockerfiles and the Kubernetes manifests (no Docker
engine runs here): they parse, point at files that exist, and use settings the service knows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.deploy.kustomize import render
from tests.deploy.test_kubernetes import probe_statuses

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
K8S_DOCS = [doc for overlay in sorted((ROOT / "deploy" / "k8s" / "overlays").iterdir())
            for doc in render(overlay)]


def settings_env_names() -> set[str]:
    from service.settings import Settings

    return {f"TESSERA_{name.upper()}" for name in Settings.model_fields}


def pins(path: Path) -> dict[str, str]:
    result = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            result[re.sub(r"\[.*\]", "", name).lower()] = version
    return result


def test_compose_services_depend_only_on_services_that_exist():
    services = COMPOSE["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"


@pytest.mark.parametrize("service", ["service", "ray-head"])
def test_compose_builds_from_dockerfiles_whose_copied_paths_exist(service):
    build = COMPOSE["services"][service]["build"]
    dockerfile = ROOT / build["context"] / build["dockerfile"]
    assert dockerfile.is_file()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), f"{dockerfile.name} copies missing {source}"


def test_every_tessera_variable_in_compose_and_kubernetes_is_a_real_setting():
    known = settings_env_names()
    used = set(COMPOSE["services"]["service"]["environment"])
    for doc in K8S_DOCS:
        for container in _containers(doc):
            used |= {env["name"] for env in container.get("env", [])}
    unknown = {name for name in used if name.startswith("TESSERA_")} - known
    assert unknown == set()


def test_compose_points_the_service_at_the_compose_hosts():
    env = COMPOSE["services"]["service"]["environment"]
    hosts = set(COMPOSE["services"])
    assert re.match(r"http://([\w-]+):8265", env["TESSERA_RAY_ADDRESS"]).group(1) in hosts
    assert re.search(r"@([\w-]+):5432/", env["TESSERA_DATABASE_URL"]).group(1) in hosts
    assert re.match(r"http://([\w-]+):9000", env["AWS_ENDPOINT_URL"]).group(1) in hosts
    assert env["TESSERA_STORAGE_URL"].startswith("s3://tessera-runs/")
    assert "tessera-runs" in " ".join(COMPOSE["services"]["minio-init"]["entrypoint"])


def test_kubernetes_manifests_are_well_formed_and_probe_a_real_route(tmp_path):
    kinds = {doc["kind"] for doc in K8S_DOCS}
    assert {"Deployment", "Service", "RayCluster"} <= kinds
    for doc in K8S_DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        for container in _containers(doc):
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in container and "httpGet" in container[probe]:
                    assert probe_statuses(tmp_path, [container[probe]["httpGet"]["path"]]) == [200]
    deployment = next(d for d in K8S_DOCS if d["kind"] == "Deployment")
    service = next(d for d in K8S_DOCS if d["kind"] == "Service")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_service_image_pins_match_the_main_pins_and_leave_out_torch():
    service_pins = pins(ROOT / "deploy" / "requirements-service.txt")
    main_pins = pins(ROOT / "requirements.txt")
    assert "torch" not in service_pins
    assert {name: main_pins.get(name) for name in service_pins} == service_pins


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    templates = [spec.get("template")]
    if doc["kind"] == "RayCluster":
        templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    return [c for t in templates if t for c in t["spec"]["containers"]]


# --- what the service image contains ----------------------------------------------------------

SERVICE_DOCKERFILE = ROOT / "deploy" / "service.Dockerfile"
NOT_IN_BUILD_CONTEXT = {"__pycache__", ".pytest_cache"}  # build output, absent from a fresh clone


def image_files(dockerfile: Path) -> dict[PurePosixPath, Path]:
    """``{path in the image: file in this repository}`` for every file the Dockerfile's ``COPY``
    lines put in the image (sources relative to the build context, the repository root;
    destinations relative to the current ``WORKDIR``)."""
    files: dict[PurePosixPath, Path] = {}
    workdir = PurePosixPath("/")
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["WORKDIR"]:
            workdir = workdir / words[1]
        elif words[:1] == ["COPY"]:
            assert not any(w.startswith("--") for w in words[1:]), f"unsupported COPY flag in {line!r}"
            *sources, destination = words[1:]
            target = workdir / destination
            for source in sources:
                path = ROOT / source
                into = target / path.name if path.is_file() and (destination.endswith("/") or len(sources) > 1) \
                    else target
                if path.is_file():
                    files[into] = path
                for file in sorted(path.rglob("*")) if path.is_dir() else ():
                    relative = file.relative_to(path)
                    if file.is_file() and not NOT_IN_BUILD_CONTEXT & set(relative.parts):
                        files[into / PurePosixPath(*relative.parts)] = file
    return files


def served_cards() -> dict[str, Path]:
    """``{algorithm: card file}`` for every card ``GET /api/v1/algorithms/{name}/card`` serves
    from this checkout."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from api import catalog, method_cards
    from service.routes import catalog as catalog_routes

    app = FastAPI()
    app.include_router(catalog_routes.router)
    client = TestClient(app)
    cards = {}
    for name in catalog.ALGORITHMS:
        if client.get(f"/api/v1/algorithms/{name}/card").status_code == 200:
            cards[name] = Path(str(method_cards.CARDS.joinpath(method_cards.card_file_name(name))))
    return cards


def test_every_method_card_the_service_serves_is_copied_into_its_image():
    from api import catalog

    cards = served_cards()
    assert set(cards) == set(catalog.ALGORITHMS)  # every method has a card, and it is served
    copied = set(image_files(SERVICE_DOCKERFILE).values())
    missing = sorted(str(path.relative_to(ROOT)) for path in cards.values() if path not in copied)
    assert missing == [], f"service.Dockerfile does not copy these served method cards: {missing}"


# The image runs `tessera serve`, a console script of the package `pip install .` put in
# site-packages; the copied source tree under /app is what `python -m` from /app would use.
# Both must answer every card with nothing but the files the Dockerfile copies.
CARD_PROBE = """
import json, sys
# Only the files under test: drop the finder of this virtualenv's editable install of the repo.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
from fastapi import FastAPI
from fastapi.testclient import TestClient
from api import catalog
from service.routes import catalog as catalog_routes
app = FastAPI()
app.include_router(catalog_routes.router)
client = TestClient(app)
answers = {name: client.get(f"/api/v1/algorithms/{name}/card") for name in catalog.ALGORITHMS}
print(json.dumps({
    "cards": {name: r.text for name, r in answers.items() if r.status_code == 200},
    "statuses": {name: r.status_code for name, r in answers.items()},
    "module_files": sorted({m.__file__ for n, m in sys.modules.items()
                            if n.split(".")[0] in ("api", "service", "cli") and getattr(m, "__file__", None)}),
    "forbidden": sorted(n for n in ("torch", "workers", "algorithms") if n in sys.modules),
}))
"""


@pytest.fixture(scope="module")
def service_image_tree(tmp_path_factory) -> Path:
    """A folder holding what the service image holds: ``app/`` (the copied files, as under its
    WORKDIR) and ``site/`` (``pip install --no-deps .`` of them, as the image's RUN line does)."""
    root = tmp_path_factory.mktemp("service-image")
    for image_path, source in image_files(SERVICE_DOCKERFILE).items():
        if image_path.is_relative_to("/app"):
            target = root / "app" / image_path.relative_to("/app")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                             "--no-index", "--target", str(root / "site"), str(root / "app")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return root


@pytest.mark.parametrize("layout", ["site", "app"])
def test_the_service_image_serves_every_card_from_only_the_files_it_copies(service_image_tree, layout):
    elsewhere = service_image_tree / "cwd"
    elsewhere.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(service_image_tree / layout)}
    result = subprocess.run([sys.executable, "-c", CARD_PROBE], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["forbidden"] == []
    outside = [f for f in probe["module_files"] if not Path(f).is_relative_to(service_image_tree / layout)]
    assert outside == [], "modules loaded from outside the image's files"
    assert probe["statuses"] == {name: 200 for name in served_cards()}
    assert probe["cards"] == {name: path.read_text(encoding="utf-8") for name, path in served_cards().items()}
