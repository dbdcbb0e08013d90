"""Bring-your-own-model specs: any torchvision classification architecture, or your own code.

    model: {name: torchvision, arch: resnet50, params: {...}}        # random init, never downloads weights
    model: {import: "my_project.nets:build", params: {width: 64}}   # your callable, shipped with --code
    code: {digest: <sha256 of the package>}                          # set by `tessera submit --code DIR`
    code: {requirements: ["einops==0.8.1"]}                          # pip packages the workers install too

The imported callable is called on the workers as ``build(num_classes=..., in_channels=...,
**params)`` (text data: ``build(vocab_size=..., **params)``) and returns an ``nn.Module``; if that
module has a ``loss(outputs, targets)`` method, it replaces the task's default loss. The control
plane only checks the string's shape: it never imports user code.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from api.torchvision_archs import TORCHVISION_ARCHS
from api.validation_errors import worded_pattern

# Keyword arguments Tessera sets itself; a spec that sets them would be silently overridden.
_RESERVED_PARAMS = {"num_classes", "in_channels", "vocab_size"}
# Pretrained weights would be downloaded on every worker; runs start from random weights.
_WEIGHT_PARAMS = {"weights", "weights_backbone", "pretrained", "progress"}
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATTERN = rf"^{_IDENTIFIER}(\.{_IDENTIFIER})*:{_IDENTIFIER}$"
SHA256_PATTERN = worded_pattern(r"^[0-9a-f]{64}$", "64 lowercase hex digits (a sha256)")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_params(params: dict[str, Any], *, forbidden: set[str], what: str) -> dict[str, Any]:
    clashes = sorted(set(params) & forbidden)
    if clashes:
        raise ValueError(f"params may not set {', '.join(repr(c) for c in clashes)}: {what}")
    return params


class TorchvisionModelSpec(_Spec):
    """A torchvision classification architecture by name, randomly initialised (``weights=None``)."""

    name: Literal["torchvision"]
    arch: str = Field(..., description="a torchvision classification model, e.g. resnet50, vit_b_16, convnext_tiny",
                      json_schema_extra={"enum": list(TORCHVISION_ARCHS)})
    small_input_stem: bool | None = Field(
        None, description="ResNet family: 3x3 stride-1 stem without max-pool. Default: on for images under 64px")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="keyword arguments of the torchvision builder, e.g. {dropout: 0.2}")

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, arch: str) -> str:
        if arch in TORCHVISION_ARCHS:
            return arch
        close = difflib.get_close_matches(arch, TORCHVISION_ARCHS, n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise ValueError(f"arch {arch!r} is not a torchvision classification model{hint} "
                         f"(all {len(TORCHVISION_ARCHS)}: GET /api/v1/models)")

    @field_validator("params")
    @classmethod
    def _no_reserved_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        if "small_input_stem" in params:  # the builders take no such argument: it failed on the worker
            raise ValueError("small_input_stem is a field of the model, not an argument of the torchvision "
                             "builder: model: {name: torchvision, arch: ..., small_input_stem: true}")
        return _check_params(params, forbidden=_RESERVED_PARAMS | _WEIGHT_PARAMS,
                             what="Tessera sets the classes and channels from the data and always starts from "
                                  "random weights")


def checked_import_path(path: str, *, example: str) -> str:
    """``path`` if it is ``'package.module:callable'``, else a ``ValueError`` that shows ``example``."""
    if not re.match(IMPORT_PATTERN, path):
        raise ValueError(f"import {path!r} must be 'package.module:callable' (dotted Python names, one colon), "
                         f"e.g. {example!r}")
    return path


def refuse_unknown_fields(data: Any, fields: tuple[str, ...], *, what: str) -> Any:
    """``data`` unless it is a mapping with a key outside ``fields`` (``import_path`` is the
    alias's field name), which is a ``ValueError`` naming the fields allowed next to ``import``:
    an ``import`` form's own message (the named forms' fields are different)."""
    if isinstance(data, dict):
        unknown = sorted(str(k) for k in data if k not in ("import_path", *fields))
        if unknown:
            raise ValueError(f"{what}: unknown field(s) {', '.join(repr(k) for k in unknown)} next to 'import'; "
                             f"allowed fields here: {', '.join(fields)}")
    return data


def module_name(import_path: str) -> str:
    """The module of an import path: ``package.module`` of ``package.module:callable``."""
    return import_path.partition(":")[0]


class ImportPath:
    """Mixin of the ``import: "package.module:callable"`` specs (model, data sets): the parts of
    their ``import_path`` field."""

    import_path: str  # declared by the spec class (a pydantic field)

    @property
    def module_name(self) -> str:
        return module_name(self.import_path)

    @property
    def attribute(self) -> str:
        return self.import_path.partition(":")[2]


class ImportedModelSpec(ImportPath, _Spec):
    """Your own model: ``import: "package.module:callable"``, shipped as a code package."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)

    import_path: str = Field(..., alias="import", max_length=512,
                             description="'package.module:callable' returning an nn.Module")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the callable")

    @model_validator(mode="before")
    @classmethod
    def _only_known_fields(cls, data: Any) -> Any:
        return refuse_unknown_fields(data, ("import", "params"), what="model")

    @field_validator("import_path")
    @classmethod
    def _module_colon_callable(cls, path: str) -> str:
        return checked_import_path(path, example="my_project.nets:build")

    @field_validator("params")
    @classmethod
    def _no_reserved_params(cls, params: dict[str, Any]) -> dict[str, Any]:
        return _check_params(params, forbidden=_RESERVED_PARAMS,
                             what="Tessera passes num_classes and in_channels (or vocab_size) from the data")

    @property
    def name(self) -> str:
        """Not a field: lets code that labels models by ``spec.model.name`` treat every form alike."""
        return "import"


MAX_REQUIREMENTS = 64
MAX_REQUIREMENT_CHARS = 300


def _checked_requirement(text: str) -> str:
    """``text`` stripped, or a ``ValueError`` naming it: one PEP 508 requirement (a name, extras,
    a version range, markers, or ``name @ URL`` with an absolute URL), not a pip option or a
    file that pip would look for in the worker's working folder."""
    from packaging.requirements import InvalidRequirement, Requirement  # only specs with requirements pay

    shown = repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    text = text.strip()
    if not text or len(text) > MAX_REQUIREMENT_CHARS:
        raise ValueError(f"{shown} must be 1 to {MAX_REQUIREMENT_CHARS} characters: {_ALLOWED}")
    if text.startswith("-"):
        raise ValueError(f"{shown} is a pip option; allowed: {_ALLOWED} (point pip at another index with "
                         "PIP_INDEX_URL in the workers' environment)")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"{shown} is not a PEP 508 requirement ({str(exc).splitlines()[0]}); allowed: "
                         f"{_ALLOWED}") from None
    if requirement.name.lower().endswith(_ARCHIVE_SUFFIXES):
        raise ValueError(f"{shown} names a file, which pip would look for in the worker's working folder; "
                         f"allowed: {_ALLOWED}")
    if requirement.url is not None and ":" not in requirement.url.split("/", 1)[0]:
        raise ValueError(f"{shown} points at a relative path, which pip would resolve on the worker; allowed: "
                         f"{_ALLOWED} ('name @ file:///path/name.whl' for a file every worker has)")
    return text


_ALLOWED = "a requirement such as 'einops==0.8.1', 'scipy>=1.11,<2' or 'name @ https://host/name.whl'"
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")


PipRequirement = Annotated[str, AfterValidator(_checked_requirement)]


class CodeRef(_Spec):
    """A code package the service stores (``POST /api/v1/code``), by the sha256 of its zip, and
    the pip requirements it needs beyond the workers' own packages. The service only parses the
    requirements (PEP 508); each worker installs them (``workers.models.user_requirements``)."""

    digest: str = Field(..., pattern=SHA256_PATTERN, description="sha256 of the package zip, 64 lowercase hex digits")
    requirements: list[PipRequirement] = Field(
        default_factory=list, max_length=MAX_REQUIREMENTS, exclude_if=lambda requirements: not requirements,
        description="pip requirements (PEP 508, e.g. 'einops==0.8.1') the workers install once per machine beside "
                    "the package; packages the workers have already are never replaced")


def route_import_form(value: Any, handler: Any, imported: type[BaseModel], *, what: str) -> Any:
    """``value`` as a named form (``handler``: the union discriminated on ``name``) or, with an
    ``import`` key, as ``imported`` (your own code's). Routing on the key keeps each form's
    errors its own (a union would report every form's complaints about every input)."""
    if isinstance(value, imported):
        return value
    if isinstance(value, dict) and "import" in value:
        if "name" in value:
            raise ValueError(f"{what} has both name {value['name']!r} and import {value['import']!r}; give name "
                             "(a built-in one) or import (your own code's 'package.module:callable'), not both")
        return imported.model_validate(value)
    return handler(value)


def route_model_spec(value: Any, handler: Any) -> Any:
    """``model``: a named model or, with an ``import`` key, an ``ImportedModelSpec``."""
    return route_import_form(value, handler, ImportedModelSpec, what="model")


@dataclass(frozen=True)
class ModelTraits:
    """What the cross-field rules need to know about a model: its data domain and architecture
    (``None``: unknown, as for your own code; rules that depend on it are left to the run)."""

    label: str
    domain: Literal["vision", "text"] | None
    architecture: Literal["cnn", "transformer"] | None


_TRANSFORMER_ARCHS = re.compile(r"^(vit|swin|maxvit)_")


def torchvision_traits(arch: str) -> ModelTraits:
    return ModelTraits(f"torchvision {arch}", "vision", "transformer" if _TRANSFORMER_ARCHS.match(arch) else "cnn")


def imported_traits(spec: ImportedModelSpec) -> ModelTraits:
    return ModelTraits(f"import {spec.import_path}", None, None)
