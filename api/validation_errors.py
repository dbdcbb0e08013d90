"""Pydantic validation errors as the items of a 422: ``{"field", "loc", "msg", "input"}``.

``field`` is the dotted path the user wrote (``optimizer.lr``, not pydantic's
``optimizer.sgd.lr``; without the body, for a model the SDK built, pydantic's location as it
stands; a dict key that is not a plain name in brackets, ``search.params['optimizer.lr']``:
``join_field``), ``input`` the bad value and ``msg`` what is allowed; for unknown fields the
allowed names are appended. The service answers its 422s with these items (``service.errors``)
and the CLI prints the same ones for a spec file or an SDK call that does not validate, so a user
reads one wording whichever way the input came.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
from collections.abc import Iterable
from typing import Any


# How much of a bad value an error echoes: a 900 KB note refused for its length was sent back
# whole in its 422 (and printed whole by the CLI). Enough to recognise the value, not to copy it.
ECHOED_CHARS = 200
# Where in a request an error's loc may start (FastAPI's; pydantic's own locs start in the body).
_SOURCES = ("body", "query", "path", "header")


def field_error(field: str, loc: list[Any], msg: str, value: Any) -> dict[str, Any]:
    return {"field": field, "loc": loc, "msg": msg, "input": value}


def echoed(value: Any) -> Any:
    """``value`` as an error shows it: as it is, or when it is a long string (or a list or object
    whose JSON is long) its first ``ECHOED_CHARS`` characters and how long it was, as a string."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, dict)):
        try:
            text = json.dumps(value, default=str)
        except (TypeError, ValueError):  # an exotic value: its repr, cut as a string would be
            text = repr(value)
    else:
        return value
    if len(text) <= ECHOED_CHARS:
        return value
    return f"{text[:ECHOED_CHARS]}… ({len(text)} characters in all)"


def body_error(field: str, msg: str, value: Any, *, within: tuple[str, ...] = ("body",)) -> dict[str, Any]:
    """``field_error`` for ``field`` of the request body (``within``: where in the request),
    named as ``join_field`` names it; its ``loc`` splits it as ``split_field`` does."""
    try:
        parts = split_field(field)
    except ValueError:  # not a name join_field writes: keep it whole rather than guess
        parts = [field]
    return field_error(field, [*within, *parts], msg, value)


def _schema_node(schema: dict[str, Any], loc: list[Any]) -> dict[str, Any] | None:
    """The schema object at pydantic location ``loc`` (which includes union tags)."""
    defs = schema.get("$defs", {})

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = defs.get(node["$ref"].rsplit("/", 1)[-1], {})
        return node

    def members(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = node.get("oneOf") or node.get("anyOf")
        return [resolve(m) for m in found] if found else [node]

    node = resolve(schema)
    for segment in loc:
        candidates = [m for m in members(node) if m.get("type") != "null"]
        mapping = {}
        for candidate in [node, *candidates]:
            mapping.update(candidate.get("discriminator", {}).get("mapping", {}))
        if isinstance(segment, str) and segment in mapping:  # a union tag: pick that member
            node = resolve({"$ref": mapping[segment]})
            continue
        if isinstance(segment, str) and any(c is defs.get(segment) for c in candidates):
            node = defs[segment]  # pydantic's label of a plain union's member: ('from', 'ForkStep')
            continue
        for candidate in candidates:
            if isinstance(segment, int) and "items" in candidate:
                node = resolve(candidate["items"])
                break
            if isinstance(segment, str) and segment in candidate.get("properties", {}):
                node = resolve(candidate["properties"][segment])
                break
            if isinstance(segment, str) and isinstance(candidate.get("additionalProperties"), dict):
                node = resolve(candidate["additionalProperties"])  # a dict's value: search.params['optimizer.lr']
                break
        else:
            return None
    return node


def _allowed_fields(schema: dict[str, Any] | None, loc: list[Any]) -> list[str]:
    node = _schema_node(schema, loc) if schema else None
    if node is None:
        return []
    for member in [node, *(node.get("oneOf") or node.get("anyOf") or [])]:
        if "properties" in member:
            return list(member["properties"])
    return []


def _trim_loc(loc: list[Any], body: Any) -> list[Any]:
    """Drop what pydantic appends after a scalar value (union member labels such as 'int')."""
    node = body
    for index, segment in enumerate(loc):
        if isinstance(node, dict):
            if segment in node:
                node = node[segment]
            elif node.get("name") != segment:
                return loc  # a missing or unknown field: keep the rest as pydantic wrote it
        elif isinstance(node, list) and isinstance(segment, int) and 0 <= segment < len(node):
            node = node[segment]
        else:
            return loc[:index]
    return loc


# A field, or a dict key, written after a dot; any other key is written in brackets, quoted.
# ASCII only, as the dashboard's twin (spec_source.js) reads it: 'optimizér' is a bracketed key.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def join_field(parts: Iterable[str | int]) -> str:
    """The field name of a path: names joined by dots, list indices as ``[0]``, and a dict key
    that is not a plain name (a dot, a space, a leading digit) quoted in brackets, so that a
    sweep's ``("search", "params", "optimizer.lr", "grid")`` reads ``search.params['optimizer.lr'].grid``
    and not as a nested ``optimizer`` object. ``split_field`` reads it back."""
    text = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        elif _PLAIN_NAME.fullmatch(part := str(part)):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def field_path(loc: tuple[Any, ...] | list[Any], body: Any) -> str:
    """Path of a pydantic error location as ``join_field`` writes it, without the union tags
    pydantic inserts.

    pydantic reports ``('optimizer', 'sgd', 'lr')`` for a discriminated union; users wrote
    ``optimizer.lr``. Walk the submitted body and keep only the segments that exist in it.
    """
    loc = list(loc)
    key_error = bool(loc) and loc[-1] == "[key]"  # pydantic's mark of a bad dict key, after the key
    parts: list[str | int] = []
    node = body
    for segment in loc[:-1] if key_error else loc:
        if isinstance(node, dict) and segment in node:
            node = node[segment]
            parts.append(str(segment))  # a key, even one YAML read as a number
        elif isinstance(node, list) and isinstance(segment, int) and 0 <= segment < len(node):
            node = node[segment]
            parts.append(segment)
        elif isinstance(node, dict) and node.get("name") == segment:
            continue  # a discriminated-union tag, not a field
        else:
            parts.append(segment)
            node = None
    return join_field(parts) + ("[key]" if key_error else "")


# The specs' string patterns in words (``worded_pattern``): pydantic's message quotes only the regex.
PATTERN_WORDS: dict[str, str] = {}


def worded_pattern(pattern: str, words: str) -> str:
    """``pattern``, for a field's ``Field(pattern=...)``, with what it allows in words; a value
    that does not match gets ``should be <words>`` in its 422. One pattern has one wording."""
    if PATTERN_WORDS.setdefault(pattern, words) != words:
        raise ValueError(f"pattern {pattern!r} is worded already: {PATTERN_WORDS[pattern]!r}")
    return pattern


# A message of a whole-object rule that starts with the path it is about, as ``join_field``
# writes it: "scheduler.grace_period 2ep must ...", "search.params['optimizer.lr']: value ...".
_QUOTED = r"'(?:[^'\\\n]|\\.)*'" + "|" + r'"(?:[^"\\\n]|\\.)*"'  # a key as repr() quotes it
_LEADING_PATH = re.compile(rf"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[(?:{_QUOTED})\]|\[\d+\])+(?=[:\s])")
_PATH_PART = re.compile(rf"\.?({_PLAIN_NAME.pattern})|\[({_QUOTED})\]|\[(\d+)\]|(\[key\])")


def split_field(field: str) -> list[str | int]:
    """``join_field``'s parts back: ``a.b['c.d'][0]`` as ``["a", "b", "c.d", 0]``, a loc for a
    field name that does not split a key at its dots (``field_path``'s ``[key]``, for a bad dict
    key, stays ``"[key]"`` as in pydantic's loc). ValueError for text that is no such name."""
    parts: list[str | int] = []
    position = 0
    while position < len(field):
        match = _PATH_PART.match(field, position)
        if match is None or (match[1] is not None and (position == 0) == match[0].startswith(".")):
            raise ValueError(f"not a field name: {field!r} (at {position})")
        name, key, index, key_mark = match.groups()
        parts.append(name or key_mark or (ast.literal_eval(key) if key else int(index)))
        position = match.end()
    return parts


def _walk(parts: list[str | int], body: Any) -> tuple[bool, Any]:
    """(found, value) at ``parts`` in ``body``; a last key the body leaves out is found as None."""
    node = body
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and (part in node or last):
            node = node.get(part)
        else:
            return False, None
    return True, node


def _field_named_in(msg: str, body: Any, field: str) -> tuple[str, Any] | None:
    """(path, value) when the message of a rule over the object at ``field`` begins with a path to
    one of its fields. The path is written from the RunSpec's root (``parallelism.num_workers``),
    which may itself sit inside the body (a sweep's ``base``): it is tried under each prefix of
    ``field``, longest first. The value is None for a field the body leaves out; None if the
    message names no such path."""
    match = _LEADING_PATH.match(msg)
    if match is None:
        return None
    try:
        named, within = split_field(match[0]), split_field(field)
    except ValueError:  # not a name join_field wrote: the message names no field of this body
        return None
    for cut in range(len(within), -1, -1):
        full = join_field(within[:cut] + named)
        if field and not full.startswith(f"{field}.") and not full.startswith(f"{field}["):
            continue
        found, value = _walk(within[:cut] + named, body)
        if found:
            return full, value
    return None


# Objects a message names by what they accept, not by pydantic's class name ("a valid dictionary
# or instance of ParamDomain"); any other object is named by its fields (``_object_form``).
OBJECT_FORMS: dict[str, str] = {
    "ParamDomain": "an object with exactly one of grid, choice, uniform, loguniform: {grid: [v1, v2, ...]} (every "
                   "value), {choice: [v1, v2, ...]} (sampled), {uniform: [low, high]} or {loguniform: [low, high]} "
                   "(sampled, low > 0)",
    "ForkStep": "an object {step: N}, N the batch of one of the parent's committed checkpoints",
}
# pydantic's labels of a plain union's members in a location: ('from', "literal['latest','scratch']").
# A model member is labelled by its class's name (CamelCase: no field of the specs is).
_MEMBER_LABEL = re.compile(r"^(?:literal|function-\w+|list|dict|tuple|set|union|nullable|definition-ref)\[.*\]$|"
                           r"^(?:int|float|str|bool|none|bytes)$|^[A-Z][A-Za-z0-9]*$")
# What a discriminated union's members are, by the field that holds one (the last name of its path).
_UNION_NOUNS = {"algorithms": "algorithm", "loggers": "logger", "train": "data set", "eval": "data set"}
_OWN_MODEL = " (or your own code: {import: 'package.module:callable'})"


def _without_member_labels(inner: list[Any], body: Any, schema: dict[str, Any] | None) -> list[Any]:
    """``inner`` less the labels pydantic gives a plain union's members (``from.ForkStep.step`` is
    ``from.step`` as the user wrote it): a segment the body does not hold there that is a schema
    class's name or one of pydantic's type labels."""
    defs = (schema or {}).get("$defs", {})
    kept: list[Any] = []
    node = body
    for segment in inner:
        if isinstance(node, dict) and segment not in node and node.get("name") != segment and isinstance(
                segment, str) and (segment in defs or _MEMBER_LABEL.match(segment)):
            continue
        kept.append(segment)
        if isinstance(node, dict):
            node = node.get(segment) if segment in node else (node if node.get("name") == segment else None)
        elif isinstance(node, list) and isinstance(segment, int) and 0 <= segment < len(node):
            node = node[segment]
        else:
            node = None
    return kept


def _object_form(error: dict[str, Any], inner: list[Any], schema: dict[str, Any] | None) -> str | None:
    """What the object at ``inner`` accepts, for an input that is not an object at all."""
    ctx = error.get("ctx") or {}
    node = None
    if schema:
        defs = schema.get("$defs", {})
        node = defs.get(ctx.get("class_name")) or (defs.get(inner[-1]) if inner and isinstance(inner[-1], str)
                                                   else None) or _schema_node(schema, inner)
    label = inner[-1] if inner and isinstance(inner[-1], str) else None  # ('from', 'ForkStep'), even without a schema
    title = ctx.get("class_name") or (node or {}).get("title") or (label if label in OBJECT_FORMS else None)
    if title in OBJECT_FORMS:
        return OBJECT_FORMS[title]
    fields = list((node or {}).get("properties", {}))
    return f"an object with the fields {', '.join(fields)}" if fields else None


def _unknown_tag(field: str, tag: Any, known: list[str]) -> str:
    """``unknown algorithm 'label_smothing'; did you mean 'label_smoothing'? known: ...``"""
    try:
        names = [part for part in split_field(field) if isinstance(part, str)]
    except ValueError:  # not a name join_field writes
        names = []
    last = names[-1] if names else "name"
    noun = _UNION_NOUNS.get(last, last)
    by_case = {name.lower(): name for name in known}  # 'adamW' is 'adamw' first
    close = [by_case[c] for c in difflib.get_close_matches(str(tag).lower(), list(by_case), n=3, cutoff=0.6)]
    guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ";"
    own = ""
    if last == "model":  # a torchvision architecture's name is given as arch
        from api.torchvision_archs import TORCHVISION_ARCHS

        archs = difflib.get_close_matches(str(tag), TORCHVISION_ARCHS, n=1, cutoff=0.8)
        if archs:  # after the built-in names, which are what a close name most likely meant
            torchvision = f"{{name: torchvision, arch: {archs[0]}}}"
            guess = (f"; did you mean {' or '.join(repr(c) for c in close)}, or {torchvision}?" if close
                     else f"; did you mean {torchvision}?")
        own = _OWN_MODEL
    return f"unknown {noun} {tag!r}{guess} known: {', '.join(sorted(known))}{own}"


def _expected_tags(ctx: dict[str, Any], schema: dict[str, Any] | None, inner: list[Any]) -> list[str]:
    node = _schema_node(schema, inner) if schema else None
    tags = list((node or {}).get("discriminator", {}).get("mapping", {}))
    return tags or re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))


def _format_one(error: dict[str, Any], body: Any, schema: dict[str, Any] | None) -> dict[str, Any]:
    loc = list(error.get("loc", ()))
    source, inner = (loc[0], loc[1:]) if loc and loc[0] in _SOURCES else ("body", loc)
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    msg = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    value = error.get("input")
    if source == "body":
        # Without the body (an SDK model the CLI built), the location is the path as it stands.
        written = _without_member_labels(inner, body, schema) if body is not None else inner
        field = field_path(written if body is None else _trim_loc(written, body), body)
    else:
        field = ".".join(str(part) for part in inner)

    if kind == "value_error" and source == "body" and (named := _field_named_in(msg, body, field)):
        field, value = named  # a rule over an object that says which of its fields it is about
        loc = [source, *split_field(field)]  # and where: the loc splits as the field does
        msg = msg.removeprefix(f"{_LEADING_PATH.match(msg)[0]}: ")  # the field is named once, not twice
    elif kind == "missing" or (kind == "value_error" and source == "body" and not inner and value == body):
        value = None  # pydantic echoes the enclosing object here, which is not the bad value
    elif kind == "json_invalid" and ctx.get("error"):
        msg = f"{msg}: {ctx['error']} at position {inner[0] if inner else '?'}; send a JSON object"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        # The problem is the discriminator field itself (`model.name`), and its value the tag.
        tag = str(ctx.get("discriminator", "'name'")).strip("'")
        holder, field = field, f"{field}.{tag}" if field else tag
        value = ctx.get("tag", value.get(tag) if isinstance(value, dict) else value)
        if kind == "union_tag_not_found":
            node = _schema_node(schema, inner) if schema else None
            tags = list((node or {}).get("discriminator", {}).get("mapping", {}))
            if tags:
                msg = f"Field required: {tag!r} must be one of " + ", ".join(repr(t) for t in tags)
        elif tags := _expected_tags(ctx, schema, inner):
            msg = _unknown_tag(holder, value, tags)
    elif kind in ("model_type", "model_attributes_type") and (form := _object_form(error, inner, schema)):
        msg = f"Input should be {form}"
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") in PATTERN_WORDS:
        msg = f"should be {PATTERN_WORDS[ctx['pattern']]} (pattern {ctx['pattern']})"
    elif kind == "extra_forbidden" and source == "body":
        allowed = _allowed_fields(schema, inner[:-1])
        if allowed:
            # A close cutoff: batch_size is not microbatch_size (data.batch_size is meant), nor
            # interval eval_interval (checkpoint.interval may be).
            close = difflib.get_close_matches(str(inner[-1]), allowed, n=1, cutoff=0.85) if inner else []
            close = close or [name for name in allowed if inner and _one_edit_apart(str(inner[-1]), name)][:1]
            guess = f"; did you mean {close[0]!r}? allowed" if close else "; allowed"
            msg = f"{msg}{guess} fields here: {', '.join(allowed)}"
    return field_error(field, loc, msg, value)


def _one_edit_apart(typed: str, name: str) -> bool:
    """Whether ``typed`` is ``name`` with one character added, dropped or changed (``lrr`` for
    ``lr``): a typo short names make that ``difflib``'s ratio scores low."""
    if typed == name or abs(len(typed) - len(name)) > 1 or min(len(typed), len(name)) < 2:
        return False
    if len(typed) == len(name):
        return sum(a != b for a, b in zip(typed, name)) == 1
    longer, shorter = (typed, name) if len(typed) > len(name) else (name, typed)
    return any(longer[:i] + longer[i + 1:] == shorter for i in range(len(longer)))


def one_line(errors: list[dict[str, Any]]) -> str:
    """Pydantic's messages as one line, for a 422 whose field is the request's, not pydantic's
    (a resume's ``num_workers``, a searched value): each rule's own lines joined by ``; ``."""
    return "; ".join(str(e["msg"]).removeprefix("Value error, ").replace("\n", "; ") for e in errors)


def _one_per_line(error: dict[str, Any]) -> list[dict[str, Any]]:
    """A rule that found several problems reports one per line (``RunSpec``'s cross-field rules):
    each line becomes an error of its own, so that each names its own field."""
    lines = str(error.get("msg", "")).removeprefix("Value error, ").split("\n")
    if error.get("type") != "value_error" or len(lines) == 1:
        return [error]
    return [{**error, "msg": line} for line in lines]


def format_validation_errors(errors: list[dict[str, Any]], body: Any, schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Turn pydantic/FastAPI errors into our 422 items.

    A value refused by every member of a plain union (``int | "auto"``) gives one error per
    member; they become one item whose message lists the alternatives.
    """
    items: list[dict[str, Any]] = []
    for error in errors:
        lines = _one_per_line(error)
        if len(lines) > 1:  # several problems one rule found: an item each, never merged
            items.extend(_format_one(line, body, schema) for line in lines)
            continue
        item = _format_one(error, body, schema)
        same = next((i for i in items if item["field"] and i["field"] == item["field"]
                     and i["input"] == item["input"] and i["loc"][:-1] == item["loc"][:-1]), None)
        if same is not None:
            same["msg"] = f"{same['msg']}; or {item['msg']}"
        else:
            items.append(item)
    return _in_index_order(items)


def _list_place(item: dict[str, Any]) -> tuple[tuple[Any, ...], int] | None:
    """The list ``item`` is about one member of (its loc up to the first index, without the
    request part, which only some items carry) and the member's index; None for no list's."""
    loc = item["loc"][1:] if item["loc"] and item["loc"][0] in _SOURCES else item["loc"]
    at = next((at for at, part in enumerate(loc) if type(part) is int), None)
    return None if at is None else (tuple(loc[:at]), loc[at])


def _in_index_order(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` with those about the members of one list in the members' order, in the places
    they held. Pydantic reports a list's refused members first and a rule over the whole list
    (``eval_metrics``' repeats, a spec's cross-field rules) after them, so a 422 read
    ``eval_metrics[2]`` before ``eval_metrics[1]``."""
    places: dict[tuple[Any, ...], list[tuple[int, int]]] = {}  # a list's (place, member index) pairs
    for place, item in enumerate(items):
        if (where := _list_place(item)) is not None:
            places.setdefault(where[0], []).append((place, where[1]))
    ordered = list(items)
    for held in places.values():
        by_member = sorted(held, key=lambda pair: pair[1])
        for (place, _), (source, _) in zip(held, by_member):
            ordered[place] = items[source]
    return ordered
