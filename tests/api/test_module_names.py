"""The names a module's source binds at its top level, read with ast alone; None when a parse
cannot know them, so that the service never refuses a name the workers' import would find."""

from __future__ import annotations

import pytest

from api.module_names import MAX_SOURCE_BYTES, defined_names, missing_name


def names(source: str) -> frozenset[str] | None:
    return defined_names(source.encode())


def test_every_way_a_top_level_name_is_bound_counts():
    source = """
import torch.nn as nn
import os.path
from .layers import Block, Head as H
from typing import (Any,
    Callable)
A, (B, *C) = 1, (2, 3)
D: int = 4
E += 1
for F in range(2):
    pass
with open(__file__) as G:
    pass
try:
    from fast import build
except ImportError as H2:
    def build(num_classes): return None
if (I := 3):
    class Net: pass
async def run(): pass
match A:
    case {"k": J, **K}: pass
    case [L, *M]: pass
def make():
    global LATER
    LATER = 1
    local_only = 2
class Model:
    attribute = 1
    def method(self): inner = 1
f = lambda x: (y := x)
@register(name := "decorated")
def g(arg=(default := 1)): pass
class Sub(base_of(base := object)): pass
"""
    assert names(source) >= {"nn", "os", "Block", "H", "Any", "Callable", "A", "B", "C", "D", "E", "F", "G", "build",
                             "H2", "I", "Net", "run", "J", "K", "L", "M", "make", "LATER", "Model", "f", "name", "g",
                             "default", "Sub", "base"}
    found = names(source)
    assert not {"local_only", "attribute", "method", "inner", "x", "y"} & found


@pytest.mark.parametrize("source", [
    "from torch.nn import *\n",
    "def __getattr__(name):\n    return name\n",
    "globals()['build'] = lambda: None\n",
    "def f():\n    globals().update(build=1)\n",
    "exec('def build(): pass')\n",
    "vars()['build'] = 1\n",
    "import sys\nsys.modules[__name__] = object()\n",
    "import sys\ndef f():\n    setattr(sys.modules[__name__], 'build', f)\n",
    "setattr(registry, 'build', 1)\n",
    "import lazy_loader as lazy\n__getattr__, __dir__, __all__ = lazy.attach(__name__, submod_attrs={})\n",
    "from ._lazy import __getattr__\n",
    "import sys as _sys\n_sys.modules[__name__].__dict__['build'] = 1\n",
    "from sys import modules\nmodules[__name__].build = 1\n",
    "locals()['build'] = 1\n",
    "import importlib\ndef f():\n    setattr(importlib.import_module(__name__), 'build', f)\n",
    "import builtins\nbuiltins.exec('def build(): pass')\n",
    "def broken(:\n",  # a syntax error here: the workers' Python may be newer
    "x = 1\n" + "#" * MAX_SOURCE_BYTES,
])
def test_a_source_that_may_bind_names_a_parse_cannot_see_is_not_judged(source):
    assert names(source) is None


def test_setattr_and_vars_in_a_function_on_other_objects_are_ordinary():
    source = "def build(self):\n    setattr(self, 'a', 1)\n    return vars(self)\n"
    assert names(source) == {"build"}


def test_the_refusal_lists_the_public_names_and_the_closest():
    found = frozenset({"build", "Net", "_private", "torch"})
    assert missing_name(found, "pkg.nets:build", "pkg/nets.py") is None
    assert missing_name(found, "pkg.nets:biuld", "pkg/nets.py") == (
        "has no 'biuld' at the top level of pkg/nets.py (it defines: Net, build, torch); "
        "did you mean 'pkg.nets:build'?")
    assert missing_name(frozenset(), "pkg:build", "pkg/__init__.py") == (
        "has no 'build' at the top level of pkg/__init__.py (it defines no public names)")
