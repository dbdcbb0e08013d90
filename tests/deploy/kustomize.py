"""A renderer for the subset of kustomize that deploy/k8s uses, so the manifests can be checked
where no ``kubectl``/``kustomize`` binary exists. Anything outside the subset is refused rather
than ignored; tests/deploy/test_kubernetes.py compares its output with ``kubectl kustomize``
wherever that binary is installed.

The subset: ``resources`` (files and directories with a kustomization.yaml), ``namespace``,
``labels`` (``pairs`` on metadata only, kustomize's default) and ``patches`` given inline as
JSON 6902 operations (add, replace, remove) with a ``target`` of kind and name.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels", "patches"}
CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement."""


def render(directory: Path) -> list[dict[str, Any]]:
    """The manifests ``kubectl kustomize directory`` would print, as dicts (order aside)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            docs += render(path)
        else:
            docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch in kustomization.get("patches", []):
        _apply_patch(docs, patch, directory)
    for label in kustomization.get("labels", []):
        if set(label) - {"pairs"}:
            raise UnsupportedKustomization(f"{directory}: labels support only 'pairs', got {sorted(label)}")
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    if "namespace" in kustomization:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED_KINDS:
                doc["metadata"]["namespace"] = kustomization["namespace"]
    return docs


def _apply_patch(docs: list[dict], patch: dict, directory: Path) -> None:
    if set(patch) != {"target", "patch"} or set(patch["target"]) - {"kind", "name"}:
        raise UnsupportedKustomization(f"{directory}: only inline JSON 6902 patches with a kind/name target")
    target = patch["target"]
    matches = [doc for doc in docs if doc["kind"] == target["kind"]
               and doc["metadata"]["name"] == target.get("name", doc["metadata"]["name"])]
    if not matches:
        raise UnsupportedKustomization(f"{directory}: patch target {target} matches no resource")
    for doc in matches:
        for operation in yaml.safe_load(patch["patch"]):
            apply_operation(doc, operation)


def apply_operation(doc: dict, operation: dict) -> None:
    """One JSON Patch (RFC 6902) ``add``/``replace``/``remove`` operation, in place."""
    op, path = operation["op"], operation["path"]
    if op not in ("add", "replace", "remove"):
        raise UnsupportedKustomization(f"JSON patch op {op!r} is not supported")
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    value = copy.deepcopy(operation.get("value"))
    if isinstance(node, list):
        index = len(node) if last == "-" else int(last)
        if op == "add":
            node.insert(index, value)
        elif op == "replace":
            node[index] = value
        else:
            del node[index]
    else:
        if op in ("replace", "remove") and last not in node:
            raise KeyError(f"JSON patch {op} of missing path {path}")
        if op == "remove":
            del node[last]
        else:
            node[last] = value
