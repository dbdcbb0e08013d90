"""The names a Python module binds at its top level, read from its source with ``ast``.

The service checks the callable after an import path's colon (``my_project.nets:build``)
against the module's source in the run's code package, so a misspelt name is a 422 at submit
rather than a failed run a minute later. The source is parsed, never compiled, imported or run.

It answers only when it can be sure: ``defined_names`` returns None, and the name is let
through for the workers to find, when the module could bind names the parse cannot see: a
``from x import *``, a module-level ``__getattr__`` (defined, assigned or imported: a lazy
loader), a top-level ``setattr`` or ``locals()``, and ``globals()``, ``vars()``, ``exec``,
``eval``, ``.modules`` (``sys.modules``) or a run-time import (``import_module``,
``__import__``, ``reload``) anywhere; and when the source does not parse here (it may use syntax
of the workers' newer Python) or is too large. Everything the parse could count as bound counts
(a loop variable, a name bound in an ``if`` or ``try`` branch, a ``global`` declaration in a
function, a walrus in a decorator), so a name it refuses is one that the module's top level
binds in none of the ways Python code usually does; a module that reaches its own namespace by
other means (an alias of itself it imports by name and assigns to) is the rare case it misses.
"""

from __future__ import annotations

import ast
import difflib

MAX_SOURCE_BYTES = 1 << 20  # a larger module is let through unread
MAX_LISTED = 20  # names a message lists; the rest are counted
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def defined_names(source: bytes) -> frozenset[str] | None:
    """The names the module whose source is ``source`` binds at its top level, or None when
    they cannot be known from the source alone (see the module docstring)."""
    if len(source) > MAX_SOURCE_BYTES:
        return None
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    names: set[str] = set()
    for node in ast.walk(tree):  # the whole module: what can bind a top-level name from anywhere
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, ast.ImportFrom) and any(alias.name in ("*", "modules") for alias in node.names):
            return None  # a star import; sys.modules by another name
        elif _is_dynamic(node):
            return None
    for node in _top_level_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "locals"):
            return None  # at the top level: on this module (locals() is globals() there), or an object unfollowed
    if "__getattr__" in names:  # defined, assigned or imported (a lazy loader): any name may answer
        return None
    return frozenset(names)


def _is_dynamic(node: ast.AST) -> bool:
    """Code that can bind module names the parse cannot see: ``globals()``, ``vars()`` (of this
    module: without arguments), ``exec`` or ``eval`` anywhere (``builtins.exec`` too), any
    ``.modules`` (``sys.modules[__name__]``, under any name ``sys`` was imported as), or an
    import made at run time (``importlib.import_module``, ``__import__``, ``reload``: the module
    may import itself and set names on what it gets)."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        return (name in ("globals", "exec", "eval", "import_module", "__import__", "reload")
                or (name == "vars" and not node.args))
    return isinstance(node, ast.Attribute) and node.attr == "modules"


def _top_level_nodes(tree: ast.Module):
    """Every node in the module's own scope: inside ``if``, ``try``, ``with`` and loops, but not
    inside a function's, a class's or a lambda's body (their names are not the module's)."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # Its decorators, defaults and bases run in the module's scope (a walrus there binds).
            stack.extend(node.decorator_list)
            if isinstance(node, ast.ClassDef):
                stack.extend([*node.bases, *node.keywords])
            else:
                stack.extend([*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)])
        elif not isinstance(node, _OWN_SCOPE):
            stack.extend(ast.iter_child_nodes(node))


def missing_name(names: frozenset[str], import_path: str, file: str) -> str | None:
    """Why ``getattr(module, callable)`` of ``import_path`` (``package.module:callable``) would
    find nothing, as the end of a sentence that begins "the code package ... ", given the
    ``names`` its source ``file`` binds; None when it binds the name."""
    module, _, attribute = import_path.partition(":")
    if attribute in names:
        return None
    public = sorted(name for name in names if not name.startswith("_"))
    close = difflib.get_close_matches(attribute, public, n=1)
    guess = f"; did you mean '{module}:{close[0]}'?" if close else ""
    listed = ", ".join(public[:MAX_LISTED]) + (f" and {len(public) - MAX_LISTED} more" if len(public) > MAX_LISTED
                                               else "")
    defines = f"it defines: {listed}" if public else "it defines no public names"
    return f"has no {attribute!r} at the top level of {file} ({defines}){guess}"
