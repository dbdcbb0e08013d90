"""docker-compose.yml checked the way ``docker compose config`` would (no Docker engine here):
variables interpolated, the result valid against the Compose Specification's JSON schema (as
check-jsonschema vendors it), then its meaning: start order, health checks, profiles, scaling,
Ray's token, the admin key the host's CLI sends, the service's home kept in a volume, and every
TESSERA_* variable a real setting that loads."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from service.settings import Settings, load_settings
from tests.deploy.test_dockerfiles import instructions

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
TOKEN = "0123456789abcdef0123456789abcdef"
API_KEY = "tsk_0123456789abcdef0123456789abcdef0123456789abcdef"
ENV = {"RAY_AUTH_TOKEN": TOKEN, "TESSERA_API_KEY": API_KEY}  # what the file's header says to export
_VARIABLE = re.compile(r"\$(?:\$|\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|(?P<bare>\w+)|(?P<invalid>))")


class MissingVariable(ValueError):
    """A `${VAR:?message}` whose variable is unset: compose refuses to start."""


class InvalidTemplate(ValueError):
    """A `$` that starts no variable (`$(cmd)`, `${}`): compose refuses the file."""


def interpolate(value, env: dict[str, str]):
    """Compose's variable syntax: ``$$``, ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``, applied to every string. Like
    compose-go, a ``$`` that starts none of these is an error, and a default or a ``:?``
    message is interpolated too: always, as compose-go did before v2.10.1 (newer ones only when
    it is used), so ``$(openssl ...)`` in a message broke the file even with its variable set."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        if match["invalid"] is not None:
            raise InvalidTemplate(f"invalid template: {value!r}")
        name = match["name"] or match["bare"]
        op, arg = match["op"], interpolate(match["arg"], env) if match["arg"] else match["arg"]
        present = env.get(name) if op is None or not op.startswith(":") else (env.get(name) or None)
        if present is not None:
            return present
        if op and op.endswith("?"):
            raise MissingVariable(f"{name}: {arg}")
        return arg if op and op.endswith("-") else ""

    return _VARIABLE.sub(substitute, value)


COMPOSE = interpolate(RAW, ENV)
SERVICES = COMPOSE["services"]
RAY_NODES = ("ray-head", "ray-worker", "ray-gpu-worker")


def test_the_file_is_valid_against_the_compose_specification_schema():
    schema_file = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert errors == []


def test_the_compose_schema_catches_a_misspelt_field():
    schema_file = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    broken = interpolate(RAW, ENV)
    broken["services"]["service"]["depends_onn"] = ["postgres"]
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid(broken)


def test_compose_refuses_to_start_without_a_ray_token_and_says_how_to_make_one():
    with pytest.raises(MissingVariable, match="RAY_AUTH_TOKEN") as refused:
        interpolate(RAW, {**ENV, "RAY_AUTH_TOKEN": ""})
    assert "export RAY_AUTH_TOKEN=$(openssl rand -hex 32)" in str(refused.value)


def test_compose_refuses_to_start_without_the_admin_key_and_says_how_to_make_one():
    with pytest.raises(MissingVariable, match="TESSERA_API_KEY") as refused:
        interpolate(RAW, {**ENV, "TESSERA_API_KEY": ""})
    assert "export TESSERA_API_KEY=tsk_$(openssl rand -hex 24)" in str(refused.value)


def test_the_interpolation_follows_compose_rules():
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("$$HOME ${SET} $SET ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d}", env) == "$HOME x x d d  d"
    with pytest.raises(MissingVariable, match="EMPTY: no"):
        interpolate("${EMPTY:?no}", env)
    with pytest.raises(MissingVariable, match=r"EMPTY: run \$\(cmd\) x"):
        interpolate("${EMPTY:?run $$(cmd) $SET}", env)
    for invalid in ("$(cmd)", "${}", "a $ b", "${SET:?run $(cmd)}"):  # the last: set, but its message is invalid
        with pytest.raises(InvalidTemplate):
            interpolate(invalid, env)


def test_start_order_waits_for_what_each_service_needs():
    for name, service in SERVICES.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown service {dependency}"
            target = SERVICES[dependency]
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in target, f"{name} waits for {dependency} to be healthy; it has no healthcheck"
            if rule["condition"] == "service_completed_successfully":
                assert "restart" not in target, f"{dependency} must be a one-shot job"
            assert not target.get("profiles") or set(target["profiles"]) <= set(service.get("profiles", [])), \
                f"{name} depends on {dependency}, which only runs under a profile"
    service = SERVICES["service"]["depends_on"]
    assert {k: v["condition"] for k, v in service.items()} == {
        "postgres": "service_healthy", "ray-head": "service_healthy", "minio-init": "service_completed_successfully"}


def test_every_long_running_service_has_a_health_check():
    one_shot = {name for name, s in SERVICES.items() if "restart" not in s}
    assert one_shot == {"minio-init"}
    for name in set(SERVICES) - one_shot:
        assert SERVICES[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name


def test_the_service_health_check_is_readiness_and_its_image_checks_liveness():
    test = " ".join(SERVICES["service"]["healthcheck"]["test"])
    assert "http://127.0.0.1:8000/healthz/ready" in test
    assert "http://127.0.0.1:8000/healthz/live" in (ROOT / "deploy" / "service.Dockerfile").read_text()


def test_worker_nodes_scale_and_join_the_head_and_the_gpu_worker_is_behind_a_profile():
    head_port = next(arg.split("=")[1] for arg in SERVICES["ray-head"]["command"] if arg.startswith("--port="))
    assert "--num-cpus=0" in SERVICES["ray-head"]["command"]
    for name in ("ray-worker", "ray-gpu-worker"):
        worker = SERVICES[name]
        assert f"--address=ray-head:{head_port}" in " ".join(worker["command"])
        # `--scale ray-worker=N` needs containers without a fixed name or host port.
        assert "container_name" not in worker and "ports" not in worker
    assert "profiles" not in SERVICES["ray-worker"]
    gpu = SERVICES["ray-gpu-worker"]
    assert gpu["profiles"] == ["gpu"]
    [device] = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert [n for n, s in SERVICES.items() if "deploy" in s] == ["ray-gpu-worker"]
    assert gpu["image"] != SERVICES["ray-worker"]["image"] and "cuda" in gpu["image"]
    assert gpu["build"]["args"]["RAY_IMAGE"].endswith("-gpu") and gpu["build"]["args"]["TORCH_INDEX_URL"] == ""


def test_ray_workers_take_their_cpu_count_from_the_hosts_ray_worker_cpus():
    def num_cpus(env: dict[str, str]) -> str:
        worker = interpolate(RAW, env)["services"]["ray-worker"]
        return next(arg for arg in worker["command"] if arg.startswith("--num-cpus="))

    assert num_cpus({**ENV, "RAY_WORKER_CPUS": "7"}) == "--num-cpus=7"
    assert num_cpus(ENV) == num_cpus({**ENV, "RAY_WORKER_CPUS": ""}) == "--num-cpus=4"


def test_every_variable_a_containers_shell_expands_is_in_that_containers_environment():
    shell_variable = re.compile(r"\$\{?(\w+)")
    for name, service in SERVICES.items():
        words = [*service.get("entrypoint", []), *service.get("command", [])]
        if not words or words[0] not in ("sh", "bash"):
            assert not any("$" in word for word in words), f"{name}: no shell runs its command to expand $"
            continue
        missing = set(shell_variable.findall(" ".join(words))) - set(service.get("environment", {}))
        assert missing == set(), f"{name}: its shell expands {missing}, which compose never passes it"


def test_the_admin_key_the_host_exports_is_the_first_admin_key_of_the_service(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from tests.service.conftest import FakeJobs

    secret = SERVICES["service"]["environment"]["TESSERA_BOOTSTRAP_API_KEY"]
    assert secret == API_KEY  # the host's TESSERA_API_KEY, which its CLI sends
    # The service's first start, over SQLite: the admin key it makes is the host's.
    settings = Settings(home=tmp_path, storage_url=f"file://{tmp_path}/storage", bootstrap_api_key=secret)
    with TestClient(create_app(settings, jobs=FakeJobs(), run_dispatcher=False)) as client:
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {API_KEY}"})
        assert me.status_code == 200 and me.json()["roles"] == {"*": "admin"}
        assert client.get("/api/v1/me", headers={"Authorization": "Bearer tsk_another"}).status_code == 401
    assert f"TESSERA_API_KEY={API_KEY}" in (tmp_path / "credentials").read_text()


def test_the_service_keeps_its_home_and_so_its_credentials_file_in_a_named_volume():
    image_env = dict(pair.split("=", 1) for kind, args in instructions(ROOT / "deploy" / "service.Dockerfile")
                     if kind == "ENV" for pair in args.split())
    service = SERVICES["service"]
    home = service["environment"].get("TESSERA_HOME", image_env["TESSERA_HOME"])
    mounts = dict(reversed(volume.split(":")[:2]) for volume in service["volumes"])
    # A named volume outlives the container: a rebuild keeps the credentials file beside PostgreSQL's data.
    assert mounts.get(home) in COMPOSE["volumes"], f"no named volume on the service's TESSERA_HOME {home}"


def test_every_ray_process_and_the_service_share_the_ray_token():
    for name in (*RAY_NODES, "service"):
        env = SERVICES[name]["environment"]
        assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"]) == ("token", TOKEN), name


def test_every_tessera_variable_is_a_setting_and_the_service_env_loads(monkeypatch):
    known = {f"TESSERA_{name.upper()}" for name in Settings.model_fields}
    for name, service in SERVICES.items():
        unknown = {key for key in service.get("environment", {}) if key.startswith("TESSERA_")} - known
        assert unknown == set(), f"{name} sets variables the service does not read: {unknown}"
    env = SERVICES["service"]["environment"]
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = load_settings()
    assert settings.ray_address == "http://ray-head:8265" and not settings.embedded_ray
    assert settings.database_url.startswith("postgresql+psycopg://") and "@postgres:5432/" in settings.database_url
    assert settings.storage_url == "s3://tessera-runs/compose"
    assert settings.public_url == "http://service:8000" and settings.worker_python == "python"
    assert settings.bootstrap_api_key == API_KEY and not settings.autoscaler  # compose's cluster is the size it is


def test_every_node_and_the_service_reach_minio_with_the_credentials_minio_was_given():
    minio = SERVICES["minio"]["environment"]
    for name in (*RAY_NODES, "service", "minio-init"):
        env = SERVICES[name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000", name
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == \
            (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]), name
    bucket = SERVICES["service"]["environment"]["TESSERA_STORAGE_URL"].split("/")[2]
    assert f"local/{bucket}" in " ".join(SERVICES["minio-init"]["entrypoint"])
    password = SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"]
    assert f":{password}@postgres:" in SERVICES["service"]["environment"]["TESSERA_DATABASE_URL"]
