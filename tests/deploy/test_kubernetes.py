"""The Kubernetes manifests, rendered from each kustomize overlay and validated offline: built-in
kinds against the Kubernetes schemas kubernetes-validate ships, the RayCluster against a schema
of KubeRay's CRD (the fields used) whose pod templates are checked with the Kubernetes schemas;
then what the schemas cannot say (probes hit real routes, Secrets and images are consistent, the
service knows the cluster autoscales and makes its first admin key from a Secret)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import yaml
from kubernetes_validate import utils as k8s
from referencing import Registry, Resource

from tests.deploy.kustomize import UnsupportedKustomization, apply_operation, render

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
KUBERNETES_VERSION = "1.32"
RAYCLUSTER_SCHEMA = Path(__file__).parent / "schemas" / "raycluster-ray.io-v1-subset.json"


def rendered(overlay: str) -> list[dict]:
    return render(K8S / "overlays" / overlay)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == kind]


@cache
def raycluster_validator() -> jsonschema.Draft202012Validator:
    version = [v for v in k8s.all_versions() if k8s.major_minor(v) <= KUBERNETES_VERSION][-1]
    definitions = k8s.schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(json.loads(RAYCLUSTER_SCHEMA.read_text()), registry=registry)


def probe_statuses(tmp_path: Path, paths: list[str]) -> list[int]:
    """What the service answers on ``paths`` (over SQLite, with a Ray that answers)."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings
    from tests.service.conftest import FakeJobs

    settings = Settings(home=tmp_path, storage_url=f"file://{tmp_path}/storage")
    with TestClient(create_app(settings, jobs=FakeJobs(), run_dispatcher=False)) as client:
        return [client.get(path).status_code for path in paths]


def pod_templates(doc: dict) -> list[dict]:
    if doc["kind"] == "RayCluster":
        return [doc["spec"]["headGroupSpec"]["template"]] + [g["template"] for g in doc["spec"]["workerGroupSpecs"]]
    template = doc.get("spec", {}).get("template")
    return [template] if template else []


def containers(doc: dict) -> list[dict]:
    return [c for t in pod_templates(doc) for c in t["spec"]["containers"]]


def service_env(docs: list[dict]) -> dict[str, dict]:
    [deployment] = by_kind(docs, "Deployment")
    [container] = containers(deployment)
    return {e["name"]: e for e in container["env"]}


def documented_secrets() -> dict[str, str]:
    """``{Secret: its lines}`` of the table of Secrets the base's kustomization.yaml says the
    operator creates in the namespace (never in git): the contract of the manifests' secretKeyRefs."""
    lines = (K8S / "base" / "kustomization.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# Secrets it expects"))
    secrets: dict[str, str] = {}
    name = None
    for line in lines[start + 1:]:
        if not line.startswith("#  "):
            break
        entry = re.match(r"#\s{3}(tessera-[\w-]+)\s+(.*)", line)
        name = entry[1] if entry else name
        secrets[name] = secrets.get(name, "") + " " + (entry[2] if entry else line.lstrip("# "))
    return secrets


def test_there_is_a_production_overlay_and_one_with_its_own_postgres():
    assert {"production", "with-postgres"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_of_the_overlay_validates_against_its_schema(overlay):
    docs = rendered(overlay)
    assert {"Deployment", "Service", "RayCluster"} <= {d["kind"] for d in docs}
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "RayCluster":
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                      for e in raycluster_validator().iter_errors(doc)]
            assert errors == [], f"{overlay}: {name}: {errors[:5]}"
        else:
            try:
                k8s.validate(doc, KUBERNETES_VERSION, strict=True)
            except k8s.ValidationError as exc:
                pytest.fail(f"{overlay}: {name}: {'/'.join(map(str, exc.absolute_path))}: {exc.message}")


def test_the_schemas_catch_a_typo_in_a_pod_template_and_in_a_worker_group():
    docs = rendered("production")
    [cluster] = by_kind(docs, "RayCluster")
    apply_operation(cluster, {"op": "add", "path": "/spec/workerGroupSpecs/1/template/spec/containers/0/resource",
                              "value": {}})
    apply_operation(cluster, {"op": "add", "path": "/spec/workerGroupSpecs/0/maxReplica", "value": 3})
    messages = " ".join(e.message for e in raycluster_validator().iter_errors(cluster))
    assert "'resource' was unexpected" in messages and "'maxReplica' was unexpected" in messages
    [deployment] = by_kind(docs, "Deployment")
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(k8s.ValidationError):
        k8s.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_renderer_agrees_with_kubectl_kustomize(overlay):
    # kubectl ships with this project's machine image (google-cloud-sdk); elsewhere, install it.
    assert shutil.which("kubectl"), "kubectl is needed to cross-check the kustomize renderer: install kubectl"
    result = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    key = lambda doc: (doc["kind"], doc["metadata"]["name"])  # noqa: E731
    theirs = sorted((d for d in yaml.safe_load_all(result.stdout) if d), key=key)
    assert sorted(rendered(overlay), key=key) == theirs


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\nimages: [{name: a, newTag: b}]\n")
    with pytest.raises(UnsupportedKustomization, match="images"):
        render(tmp_path)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ray_cluster_has_cpu_and_gpu_groups_and_autoscales(overlay):
    [cluster] = by_kind(rendered(overlay), "RayCluster")
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True and spec["rayVersion"] == "2.60.0"
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    for group in groups.values():
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    [gpu] = groups["gpu"]["template"]["spec"]["containers"]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1" and "cuda" in gpu["image"]
    assert "cuda" not in groups["cpu"]["template"]["spec"]["containers"][0]["image"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_requests_and_limits(overlay):
    for doc in rendered(overlay):
        for container in containers(doc):
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"]), \
                f"{doc['metadata']['name']}/{container['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_probes_liveness_and_readiness_and_reads_credentials_from_secrets(overlay, tmp_path):
    [deployment] = by_kind(rendered(overlay), "Deployment")
    [container] = containers(deployment)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz/ready"
    assert probe_statuses(tmp_path, ["/healthz/live", "/healthz/ready"]) == [200, 200]
    env = {e["name"]: e for e in container["env"]}
    for name in ("TESSERA_DATABASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "RAY_AUTH_TOKEN"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["TESSERA_STORAGE_URL"]["value"].startswith("s3://")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_ray_process_and_the_service_hold_the_same_ray_token(overlay):
    docs = rendered(overlay)
    [cluster] = by_kind(docs, "RayCluster")
    holders = containers(cluster) + containers(by_kind(docs, "Deployment")[0]) + \
        [{"name": "autoscaler", "env": cluster["spec"]["autoscalerOptions"]["env"]}]
    for container in holders:
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "tessera-ray-token", "key": "token"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_reaches_ray_through_the_head_service_kuberay_creates(overlay):
    docs = rendered(overlay)
    [cluster] = by_kind(docs, "RayCluster")
    [deployment] = by_kind(docs, "Deployment")
    env = {e["name"]: e.get("value") for e in containers(deployment)[0]["env"]}
    # KubeRay names the head's Service `<cluster>-head-svc`; the dashboard serves the Jobs API.
    assert env["TESSERA_RAY_ADDRESS"] == f"http://{cluster['metadata']['name']}-head-svc:8265"
    [service] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "tessera-service"]
    assert env["TESSERA_PUBLIC_URL"] == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_is_told_the_ray_cluster_autoscales_so_it_accepts_runs_bigger_than_the_cluster_is(overlay):
    from service.settings import Settings

    docs = rendered(overlay)
    [cluster] = by_kind(docs, "RayCluster")
    autoscaling = cluster["spec"].get("enableInTreeAutoscaling", False)
    value = service_env(docs).get("TESSERA_AUTOSCALER", {}).get("value", "false")
    # Without it the service refuses at submit every run bigger than the pods up now: with the gpu
    # group at minReplicas 0, every GPU run. With it and no autoscaler, such a run would wait forever.
    if autoscaling:
        assert value == "true", f"{overlay}: the RayCluster autoscales; TESSERA_AUTOSCALER={value}"
    assert Settings(autoscaler=value).autoscaler is autoscaling


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_makes_its_first_admin_key_from_a_secret_the_operator_creates(overlay):
    reference = service_env(rendered(overlay))["TESSERA_BOOTSTRAP_API_KEY"]["valueFrom"]["secretKeyRef"]
    # Not optional: without the Secret the key would be a random one, written only to the pod's
    # own filesystem and lost with it, while the database keeps its hash (no admin ever again).
    assert reference == {"name": "tessera-admin-key", "key": "api-key"}
    assert re.search(r"\bapi-key\b.*\btsk_", documented_secrets()["tessera-admin-key"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_a_container_reads_is_in_the_overlay_or_in_the_kustomizations_list(overlay):
    docs = rendered(overlay)
    rendered_secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})}
                        for d in by_kind(docs, "Secret")}
    [cluster] = by_kind(docs, "RayCluster")
    envs = [e for doc in docs for c in containers(doc) for e in c.get("env", [])] + \
        cluster["spec"]["autoscalerOptions"]["env"]
    documented = documented_secrets()
    for env in envs:
        reference = env.get("valueFrom", {}).get("secretKeyRef")
        if reference is None:
            continue
        name, key = reference["name"], reference["key"]
        if name in rendered_secrets:
            assert key in rendered_secrets[name], f"{overlay}: {env['name']}: Secret {name} has no key {key}"
        else:
            assert name in documented, f"{overlay}: {env['name']} reads Secret {name}, which the base never lists"
            assert re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", documented[name]), \
                f"{overlay}: {env['name']} reads key {key} of Secret {name}, which the base does not list"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_container_sets_a_variable_twice(overlay):
    # The production overlay replaces env/1 by index: an entry added above it would be overwritten.
    for doc in rendered(overlay):
        for container in containers(doc):
            names = [e["name"] for e in container.get("env", [])]
            assert len(names) == len(set(names)), f"{overlay}: {doc['metadata']['name']}/{container['name']}"


def test_the_production_overlay_says_how_to_set_every_image_it_runs():
    comment = "\n".join(line for line in (K8S / "overlays" / "production" / "kustomization.yaml").read_text()
                        .splitlines() if line.startswith("#"))
    command = re.search(r"kustomize edit set image((?:\s*#?\s*[\w./-]+=\S*)+)", comment)
    assert command, "the overlay's comment has no `kustomize edit set image` line"
    named = set(re.findall(r"([\w./-]+)=", command[1]))
    images = {c["image"].rsplit(":", 1)[0] for doc in rendered("production") for c in containers(doc)}
    assert {image for image in images if image.startswith("tessera/")} - named == set()


def test_the_postgres_overlay_points_the_service_at_its_own_database():
    docs = rendered("with-postgres")
    [secret] = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"] == "tessera-db"]
    [statefulset] = by_kind(docs, "StatefulSet")
    [postgres_service] = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "tessera-postgres"]
    assert f"@{postgres_service['metadata']['name']}:5432/" in secret["stringData"]["url"]
    assert postgres_service["spec"]["selector"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    assert f":{secret['stringData']['password']}@" in secret["stringData"]["url"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_service_pod_runs_as_the_user_its_image_creates(overlay):
    import re

    dockerfile = (ROOT / "deploy" / "service.Dockerfile").read_text()
    uid = int(re.search(r"useradd [^\n]*--uid (\d+)", dockerfile)[1])
    [deployment] = by_kind(rendered(overlay), "Deployment")
    context = deployment["spec"]["template"]["spec"]["securityContext"]
    assert context == {"runAsNonRoot": True, "runAsUser": uid}
