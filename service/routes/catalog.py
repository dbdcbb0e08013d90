"""The catalog: every algorithm, model and data set name, its metadata and its params schema."""

from __future__ import annotations

import functools
import typing
from importlib.resources.abc import Traversable
from typing import Any

from fastapi import APIRouter, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from api import catalog, method_cards
from api.algorithm_specs import ALGORITHM_SPECS
from api.specs import DatasetSpec, ModelSpec
from api.views import CatalogEntry, CatalogPage
from service.api_docs import OPEN
from service.errors import ErrorBody
from service.json_body import ParsedBodyRoute

router = APIRouter(prefix="/api/v1", tags=["catalog"], route_class=ParsedBodyRoute)

# Method cards are package data of `api` (api/method_cards/<name>.md), which the service image
# installs; `algorithms` (torch) is not there. A module attribute so tests can point it elsewhere.
CARDS: Traversable = method_cards.CARDS


def _union_members_by_name(union: Any) -> dict[str, type[BaseModel]]:
    """``{name: spec class}`` for a discriminated union such as ``api.specs.ModelSpec``."""
    annotated_union = typing.get_args(union)[0]  # Annotated[Union[...], Field(discriminator=...)]
    members: dict[str, type[BaseModel]] = {}
    for member in typing.get_args(annotated_union):
        for name in typing.get_args(member.model_fields["name"].annotation):
            members[name] = member
    return members


def _entries(infos: dict[str, Any], specs: dict[str, type[BaseModel]], kind: str) -> list[CatalogEntry]:
    missing = sorted(set(infos) - set(specs))
    if missing:  # a catalog name no spec accepts: fail at startup, not on a request
        raise RuntimeError(f"catalog {kind} without a spec in api: {', '.join(missing)}")
    return [CatalogEntry(**catalog.as_dict(info), params_schema=specs[name].model_json_schema())
            for name, info in infos.items()]


def build_catalog() -> dict[str, CatalogPage]:
    """The three catalog pages, each entry with its params schema."""
    return {
        "algorithms": CatalogPage(data=_entries(catalog.ALGORITHMS, ALGORITHM_SPECS, "algorithms")),
        "models": CatalogPage(data=_entries(catalog.MODELS, _union_members_by_name(ModelSpec), "models")),
        "datasets": CatalogPage(data=_entries(catalog.DATASETS, _union_members_by_name(DatasetSpec), "datasets")),
    }


@functools.cache
def pages() -> dict[str, CatalogPage]:
    """``build_catalog()`` once per process: the catalog cannot change while it runs."""
    return build_catalog()


@router.get("/algorithms", response_model=CatalogPage, operation_id="list_algorithms", openapi_extra=OPEN)
def list_algorithms() -> CatalogPage:
    """Speedup methods with their metadata (domain, needs, conflicts, maturity) and params schema."""
    return pages()["algorithms"]


@router.get("/algorithms/{name}/card", response_class=PlainTextResponse, operation_id="get_algorithm_card",
            openapi_extra=OPEN, responses={200: {"content": {"text/markdown": {}}}, 404: {"model": ErrorBody}})
def get_algorithm_card(name: str) -> PlainTextResponse:
    """The method card (``api/method_cards/<name>.md``) as markdown; 404 for unknown names or a missing card."""
    if name not in catalog.ALGORITHMS:  # only catalog names reach the file system
        raise HTTPException(status_code=404, detail=f"algorithm {name!r} not found")
    text = method_cards.read_card(name, CARDS)
    if text is None:
        raise HTTPException(status_code=404, detail=f"algorithm {name!r} has no method card yet")
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")


@router.get("/models", response_model=CatalogPage, operation_id="list_models", openapi_extra=OPEN)
def list_models() -> CatalogPage:
    return pages()["models"]


@router.get("/datasets", response_model=CatalogPage, operation_id="list_datasets", openapi_extra=OPEN)
def list_datasets() -> CatalogPage:
    return pages()["datasets"]
