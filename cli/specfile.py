"""Reading a RunSpec from a YAML or JSON file, with errors that point at the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from api.code_package import with_code_digest
from api.errors import format_detail
from api.specs import RunSpec
from api.validation_errors import format_validation_errors


class SpecFileError(Exception):
    """A spec file that cannot be read or does not validate; the message lists every problem."""


def load_spec_dict(path: str | Path, assignments: list[str] | None = None, *, sweep: bool = False) -> dict[str, Any]:
    """The mapping in the YAML or JSON file at ``path``, with ``assignments`` (``--set
    dotted.key=value``, as ``tessera fork`` reads them: ``cli.lineage.patch_from_assignments``)
    merged into it as a fork's patch is (``api.lineage.merge_patch``); for a ``sweep`` the
    ``base.`` ones merge into its base RunSpec the same way (``base.algorithms.cutmix.alpha``
    names a method). ``SpecFileError`` for a file that cannot be read or holds no mapping;
    ``cli.lineage.BadAssignment`` for a bad assignment or one that cannot be merged (a list
    position past its end): a usage error."""
    data = _read_mapping(Path(path))
    if assignments:
        from api.lineage import PatchError, merge_patch
        from cli.lineage import BadAssignment, patch_from_assignments

        patch = patch_from_assignments(assignments)
        base_patch = patch.pop("base", None) if sweep else None
        try:
            data = merge_patch(data, patch)
            if base_patch is not None:
                data["base"] = merge_patch(data.get("base") if isinstance(data.get("base"), dict) else {}, base_patch)
        except PatchError as exc:  # a list position past its end: as bad an assignment as any
            raise BadAssignment(f"--set {exc}") from exc
    return data


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecFileError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SpecFileError(f"{path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
    if not isinstance(data, dict):
        raise SpecFileError(f"{path} must hold a mapping (a RunSpec), not {type(data).__name__}")
    return data


def load_spec(path: str | Path, *, code_digest: str | None = None, assignments: list[str] | None = None) -> RunSpec:
    """Load (with ``assignments``, as ``load_spec_dict``) and validate; ``SpecFileError`` lists
    ``field: message (got value)`` per problem, worded as the service's 422 for the same spec
    (``api.validation_errors``). ``code_digest``: the spec's ``code.digest`` (``--code DIR``'s
    package), its ``code.requirements`` kept."""
    data = load_spec_dict(path, assignments)
    if code_digest is not None:
        data = with_code_digest(data, code_digest)
    try:
        return RunSpec.model_validate(data)
    except ValidationError as exc:
        items = format_validation_errors(exc.errors(), data, RunSpec.model_json_schema())
        lines = format_detail(items).splitlines()
        raise SpecFileError(f"{path} is not a valid RunSpec:\n" + "\n".join(f"  {line}" for line in lines)) from exc
