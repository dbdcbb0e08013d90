"""Static checks of docker-compose.yml, the Dockerfiles and the Kubernetes manifests (no Docker
engine runs here): they parse, point at files that exist, and use settings the service knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
K8S_DOCS = [doc for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


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


def test_kubernetes_manifests_are_well_formed_and_probe_a_real_route():
    from service.app import create_app

    paths = set(create_app().openapi()["paths"])
    kinds = {doc["kind"] for doc in K8S_DOCS}
    assert {"Deployment", "Service", "RayCluster"} <= kinds
    for doc in K8S_DOCS:
        assert doc["apiVersion"] and doc["metadata"]["name"]
        for container in _containers(doc):
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in container:
                    assert container[probe]["httpGet"]["path"] in paths
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
