"""What ``import`` would find inside a code package, read from its zip's file names alone.

The service checks a run's imports (``model.import: "my_project.nets:build"``) against the
package it names without unpacking, importing or running anything: ``ModuleTree.of(names)``
takes the zip's entry names, and ``missing_module`` says why the workers' ``import`` of an
import path's module would fail (``ModuleNotFoundError``), or None when it would find it.

It follows Python's path finder on the package's root (the folder the workers put first on
``sys.path``): in a folder, ``name`` is a regular package when ``name/__init__.py`` (or
``.pyc``, or an extension ``__init__``) exists, else a module when ``name.py``, ``name.pyc`` or an
extension module (``name.so``, ``name.cpython-312-x86_64-linux-gnu.so``, ``name.pyd``) exists,
else a namespace package when the folder ``name/`` exists; only packages (regular or namespace)
have submodules. A name the package lacks below a namespace package is not refused: Python
merges a namespace package's portions from every folder on ``sys.path``, so it may come from one
installed on the workers. The callable after the colon is checked apart, from the module's
source (``api.module_names``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

MAX_LISTED = 20  # modules a message lists; the rest are counted
# A module file: name.py, name.pyc, name.so, name.pyd, name.cpython-312-x86_64-linux-gnu.so (its
# name an identifier, Unicode ones too, as ``str.isidentifier`` has it).
_MODULE_FILE = re.compile(r"^([^\W\d]\w*)(?:\.pyc?|(?:\.[^/]*)?\.(?:so|pyd))$")
_NOT_LISTED = frozenset({"__init__", "__pycache__"})


@dataclass(frozen=True)
class ModuleTree:
    """A package's importable names, dotted (``my_project.nets``), from its file names."""

    packages: frozenset[str]  # folders with an __init__: regular packages
    modules: frozenset[str]  # module files (my_project/nets.py: my_project.nets)
    folders: frozenset[str]  # every folder whose path is dotted names: a namespace package if nothing else
    python_folders: frozenset[str]  # folders with a module file below them: the ones a listing shows

    @classmethod
    def of(cls, names: Iterable[str]) -> "ModuleTree":
        packages, modules, folders, python_folders = set(), set(), set(), set()
        for name in names:
            parts = PurePosixPath(name).parts  # "a//b.py" and "./a/b.py" are a/b.py, as they unpack
            if not parts or name.endswith("/"):  # a folder's own entry: its files name it
                continue
            folder_parts, file_name = parts[:-1], parts[-1]
            dotted: list[str] = []
            for part in folder_parts:
                if not part.isidentifier():
                    break  # this folder and what lies below it cannot be named in an import
                dotted.append(part)
                folders.add(".".join(dotted))
            if len(dotted) < len(folder_parts):  # under a folder import cannot name
                continue
            match = _MODULE_FILE.match(file_name)
            if match is None:
                continue
            python_folders.update(".".join(dotted[:depth]) for depth in range(1, len(dotted) + 1))
            if match[1] == "__init__" and dotted:
                packages.add(".".join(dotted))
            modules.add(".".join([*dotted, match[1]]))
        return cls(frozenset(packages), frozenset(modules), frozenset(folders), frozenset(python_folders))

    def top_level(self) -> frozenset[str]:
        """The names an import may begin with: top-level packages, modules, and folders with a
        module below them (namespace packages)."""
        return frozenset(name for name in self.packages | self.modules | self.python_folders if "." not in name)

    def kind(self, name: str) -> str | None:
        """``"package"``, ``"module"``, ``"namespace"`` (a folder without ``__init__``), or None
        when ``name`` (dotted, from the package's root) is none of them, in the order Python's
        finder tries them."""
        if name in self.packages:
            return "package"
        if name in self.modules:
            return "module"
        if name in self.folders:
            return "namespace"
        return None

    def children(self, parent: str) -> list[str]:
        """The modules and packages directly under ``parent``, dotted and sorted: what a listing
        shows (folders without a module below them, ``__init__`` and ``__pycache__`` left out)."""
        prefix = parent + "."
        found = {name for name in self.modules | self.python_folders
                 if name.startswith(prefix) and "." not in name[len(prefix):]
                 and name[len(prefix):] not in _NOT_LISTED}
        return sorted(found)


def missing_module(tree: ModuleTree, import_path: str) -> str | None:
    """Why importing the module of ``import_path`` (``package.module:callable``) from the package
    would fail, as the end of a sentence that begins "the code package ... ", or None when every
    dotted part below the top level is found. The top-level name is checked apart (it may be
    missing from the package altogether): here a top level the tree lacks is None."""
    module, _, attribute = import_path.partition(":")
    parts = module.split(".")
    missing = _first_missing(tree, parts)
    if missing is None:
        return None
    parent, name = ".".join(parts[:missing]), ".".join(parts[:missing + 1])
    if tree.kind(parent) == "module":
        return (f"holds {parent!r} as a module, not a package, so it holds no module {name!r}; name a callable "
                f"of that module as '{parent}:callable'")
    path = name.replace(".", "/")
    held = tree.children(parent)
    listed = ", ".join(held[:MAX_LISTED]) + (f" and {len(held) - MAX_LISTED} more" if len(held) > MAX_LISTED else "")
    holds = f"{parent} holds: {listed}" if held else f"{parent} holds no modules"
    return (f"holds no module {name!r} (neither {path}.py nor {path}/__init__.py nor a folder {path}/); "
            f"{holds}{_did_you_mean(tree, parts, missing, held, attribute)}")


def _first_missing(tree: ModuleTree, parts: list[str]) -> int | None:
    """The index of the first dotted part below the top level that import would not find, or None
    (also when it is missing below a namespace package: it may come from elsewhere on the path)."""
    for depth in range(1, len(parts)):
        parent = tree.kind(".".join(parts[:depth]))
        if parent is None:
            return None
        if parent == "module":
            return depth
        if tree.kind(".".join(parts[:depth + 1])) is None:
            return None if parent == "namespace" else depth
    return None


def _did_you_mean(tree: ModuleTree, parts: list[str], missing: int, held: list[str], attribute: str) -> str:
    """". Did you mean '...'?" naming the closest module held under the same parent (the whole
    import path when the rest of it is found there too), or "" when none is close."""
    close = difflib.get_close_matches(parts[missing], [name.rpartition(".")[2] for name in held], n=1)
    if not close:
        return ""
    guess = [*parts[:missing], close[0], *parts[missing + 1:]]
    if _first_missing(tree, guess) is None:
        return f". Did you mean '{'.'.join(guess)}:{attribute}'?"
    return f". Did you mean '{'.'.join(guess[:missing + 1])}'?"
