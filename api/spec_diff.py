"""The difference between two run specs as dotted paths: what ``tessera diff`` prints and the
dashboard's compare page shows (its JS twin, ``compare.js``'s ``specDiff``, gives the same paths;
``tests/dashboard/test_compare_page.py`` holds them together)."""

from __future__ import annotations

from typing import Any

MISSING = None  # a path one side does not have reads as null on that side


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted path: leaf}``: dicts are walked by key, lists by index (``algorithms.0.name``);
    an empty dict or list is a leaf of its own, so ``{}`` vs ``{"a": 1}`` still differ."""
    if isinstance(value, dict) and value:
        items = value.items()
    elif isinstance(value, list) and value:
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key, child in items:
        flat.update(flatten(child, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def spec_diff(*specs: dict[str, Any]) -> dict[str, list[Any]]:
    """The dotted paths whose values are not equal across ``specs`` (two or more), sorted, each
    with its value in every spec (None where a spec lacks the path). Empty: identical. A path
    that is null or absent in every spec is no difference (``limit: null`` against no ``limit``;
    ``code: null`` against ``code: {digest: ...}``, whose ``code.digest`` is the row)."""
    flats = [flatten(spec) for spec in specs]
    paths = sorted(set().union(*flats))
    diff = {}
    for path in paths:
        values = [flat.get(path, MISSING) for flat in flats]
        present = [path in flat for flat in flats]
        if all(v is None for v in values):
            continue
        if not all(_same(v, values[0]) for v in values) or not all(present):
            diff[path] = values
    return diff


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1`` (Python's ``==`` says it is; JavaScript's does not)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b
