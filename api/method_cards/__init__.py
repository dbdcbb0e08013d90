"""Method cards: one markdown file per speedup algorithm, ``<name>.md``, next to this module.

The cards are package data of ``api`` rather than files in ``algorithms/<name>/`` because the
control plane serves them (``GET /api/v1/algorithms/{name}/card``) and its image ships ``api``
but not ``algorithms`` (which needs torch). Read them through ``read_card`` so the answer is the
same from a source checkout and from an installed package (docs/architecture.md, "Method cards").
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable

CARDS: Traversable = resources.files(__name__)
"""The folder of cards: a directory in a checkout, the installed package's data otherwise."""


def card_file_name(name: str) -> str:
    """The card's file name inside this package, e.g. ``cutmix.md``."""
    return f"{name}.md"


def read_card(name: str, cards: Traversable = CARDS) -> str | None:
    """The method card of algorithm ``name`` as markdown, or None if it has none.

    Callers must pass a catalog name (``api.catalog.ALGORITHMS``): the name becomes a file name.
    """
    card = cards.joinpath(card_file_name(name))
    try:
        return card.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
