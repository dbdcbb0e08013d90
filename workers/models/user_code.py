"""Your own model: fetch the run's code package, import ``model.import``, build, and its loss.

The contract (small, like Composer's ``ComposerModel``):

- ``model: {import: "my_project.nets:build", params: {...}}`` names a callable that Tessera
  calls on every worker as ``build(num_classes=C, in_channels=K, **params)`` for images
  (``(N, K, H, W)`` float tensors) or ``build(vocab_size=V, **params)`` for text (``(N, T)``
  token ids; the model returns ``(N, T, V)`` next-token logits). It returns an ``nn.Module``
  whose ``forward(inputs)`` returns logits ``(N, C)`` (checked on the first training batch when
  the default loss reads them: ``workers.output_check``).
- If the module has a ``loss(outputs, targets)`` method, the loop uses it instead of the
  task's default (soft cross-entropy). ``targets`` are class indices, or per-class
  probabilities ``(N, C)`` when CutMix, MixUp or label smoothing are on: accept both or leave
  those methods out. Your own text data's targets may hold -100 (ignored positions; with label
  smoothing, rows of zeros): ``F.cross_entropy`` ignores them by default. Evaluation always
  reports cross-entropy and accuracy of the logits, and the spec's ``eval_metrics`` besides
  (``workers.eval_metrics``).
- Everything else is ordinary PyTorch: surgery methods (BlurPool, ChannelsLast, Factorize,
  ALiBi) change the modules they recognise and say on the run when they found none.

How the code gets to the workers: the service stores the package at
``{storage}/code/{sha256}.zip``; before building, each worker fetches it with fsspec, checks
its sha256, unpacks it once per machine in the code cache (``workers.models.code_cache``:
``$TESSERA_CODE_CACHE``, trusted only as far as this user alone can change it) and puts it first
on ``sys.path``; the spec's ``code.requirements`` are then installed beside it
(``workers.models.user_requirements``).

Why the worker fetches it rather than Ray's ``runtime_env`` (``py_modules``): Ray 2.60 takes
a local directory, ``.py`` or ``.whl`` there, but a zip only as a remote URI (``s3://``,
``file://``, ``https://``), which each node's runtime-env agent downloads. Measured with Ray
2.60 and moto: (1) the agent is a process of the raylet and does not see the job's
``env_vars``, through which Tessera hands jobs ``AWS_ENDPOINT_URL`` and credentials, so with the
endpoint given only there the download tried AWS's own endpoint and the task failed with
``RuntimeEnvSetupError`` before any Tessera code ran (only Ray's log says why); (2) with the
endpoint in the raylet's own environment the download worked, but Ray strips a zip's single
top-level folder, so ``my_project/`` landed at the root and ``import my_project`` failed. Ray
also does not check a digest. Fetching here uses the same storage access as checkpoints,
verifies the bytes, keeps the package layout, and turns every failure into the run's ``error``.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch.nn as nn

from api.code_package import CodePackageError, safe_extract, sha256_hex
from api.model_specs import CodeRef, ImportedModelSpec, ImportPath
from workers.models.code_cache import (UserCodeError, code_cache_dir, hold, keep_seconds, own_cache, place, prune,
                                       verified)
from workers.paths import code_package_url
from workers.s3_limits import bounded_fs

log = logging.getLogger(__name__)

TRACEBACK_LINES = 20


def install_code(code: CodeRef, *, storage_url: str | None,
                 fetch: Callable[[], tuple[bytes, str]] | None = None) -> Path:
    """Make the package ``code.digest`` and its ``code.requirements`` importable in this
    process; returns the package's folder.

    Fetched only when this machine's cache lacks it: from ``{storage_url}/code/{digest}.zip``,
    or by ``fetch()`` when given (``workers.export.load_model``: from the service), which returns
    the bytes and where they came from (for messages) and raises ``UserCodeError`` when it cannot.
    Either way the bytes are checked against ``digest`` before they are unpacked."""
    # Here, not at the top: packaging (its tags, ~0.2 s of imports) is for runs with a code package only.
    from workers.models.user_requirements import install_requirements

    digest = code.digest
    cache = own_cache(code_cache_dir())
    target = cache / digest
    hold(target)  # first: a prune in another process must not take the folder between placing and importing
    if not verified(target):
        if fetch is None:
            if not storage_url:
                raise UserCodeError(f"code.digest {digest}: the run has a code package but no storage URL to fetch it "
                                    "from (TESSERA_STORAGE_URL)")
            data, source = read_package(digest, code_package_url(storage_url, digest))
        else:
            data, source = fetch()
        if sha256_hex(data) != digest:
            raise UserCodeError(f"code.digest {digest}: {source} holds other bytes (sha256 {sha256_hex(data)}); "
                                "upload the package again")
        _unpack(data, target)
    _put_first_on_path(target)
    install_requirements(code.requirements)
    _prune(cache)
    return target


def _prune(cache: Path) -> None:
    """Remove what the machine's runs have not used for a while (``code_cache.prune``); a bad
    ``TESSERA_CODE_CACHE_KEEP_DAYS`` is logged and nothing is removed."""
    try:
        keep_s = keep_seconds()
    except ValueError as exc:
        log.warning("not pruning the code cache: %s", exc)
        return
    prune(cache, keep_s=keep_s)


def read_package(digest: str, url: str) -> tuple[bytes, str]:
    """The bytes at ``url`` (fsspec), and ``url``; ``UserCodeError`` when they cannot be read."""
    try:
        fs, path = bounded_fs(url)  # a store that stops answering fails the fetch (workers.s3_limits)
        return fs.cat_file(path), url
    except Exception as exc:  # FileNotFoundError, a storage outage, missing credentials, ...
        raise UserCodeError(f"code.digest {digest}: cannot fetch {url}: {type(exc).__name__}: {exc}") from None


def _unpack(data: bytes, target: Path) -> None:
    """Unpack verified bytes into ``target`` (``place``)."""
    try:
        place(target, lambda staging: safe_extract(data, staging))
    except CodePackageError as exc:
        raise UserCodeError(f"code package {target.name}: {exc}") from None
    except OSError as exc:
        raise UserCodeError(f"code package {target.name}: cannot unpack it into {target.parent}: {exc}") from None


def _put_first_on_path(folder: Path) -> None:
    entry = str(folder)
    if sys.path[:1] != [entry]:
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    # A package of the same name imported from elsewhere (another run in this process) must
    # not shadow this one.
    for name in [n for n in sys.modules if n.split(".")[0] in _top_level_names(folder)]:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if not module_file.startswith(entry + os.sep):
            del sys.modules[name]
    importlib.invalidate_caches()


def _top_level_names(folder: Path) -> set[str]:
    return {p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").is_file()}


def load_callable(spec: ImportPath, *, field: str = "model.import") -> Callable[..., Any]:
    """The callable ``spec.import_path`` names (``field``: where the spec holds it, for messages);
    ``UserCodeError`` with the traceback's tail otherwise."""
    try:
        module = importlib.import_module(spec.module_name)
    except Exception as exc:
        top = spec.module_name.split(".")[0]
        hint = (f"\n{top!r} is neither in the run's code package nor installed on the workers: send your code "
                f"with the run (tessera submit --code DIR, or code.digest), or install it on the workers"
                if isinstance(exc, ModuleNotFoundError) and exc.name == top else "")
        raise UserCodeError(f"{field} {spec.import_path!r}: importing module {spec.module_name!r} failed: "
                            f"{error_with_tail(exc)}{hint}") from None
    target = getattr(module, spec.attribute, None)
    if not callable(target):
        found = "is not callable" if target is not None else "does not exist"
        guess = "" if target is not None else did_you_mean(spec.attribute, module)
        raise UserCodeError(f"{field} {spec.import_path!r}: {spec.attribute!r} {found} in "
                            f"{getattr(module, '__file__', spec.module_name)}{guess}")
    return target


def did_you_mean(name: str, module: Any) -> str:
    """``"; did you mean 'close'?"`` naming the public name of ``module`` closest to ``name``
    (``difflib``), or "" when none is close."""
    public = [n for n in dir(module) if not n.startswith("_")]
    close = difflib.get_close_matches(name, public, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def call_user(spec: ImportPath, kwargs: dict[str, Any], *, field: str = "model.import") -> Any:
    """The callable ``spec`` names (``load_callable``), called with ``kwargs``; ``UserCodeError``
    naming the arguments, with the traceback's tail, when it raises."""
    build = load_callable(spec, field=field)
    try:
        return build(**kwargs)
    except Exception as exc:
        arguments = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
        raise UserCodeError(f"{field} {spec.import_path!r}: calling it with {arguments} failed: "
                            f"{error_with_tail(exc)}") from None


def build_user_model(spec: ImportedModelSpec, *, num_classes: int, in_channels: int, domain: str) -> nn.Module:
    """Call the user's builder with the contract's arguments; check that it returned a module."""
    kwargs = {"vocab_size": num_classes} if domain == "text" else {"num_classes": num_classes,
                                                                   "in_channels": in_channels}
    model = call_user(spec, {**kwargs, **spec.params})
    if not isinstance(model, nn.Module):
        raise UserCodeError(f"model.import {spec.import_path!r} returned a {type(model).__name__}, not a "
                            "torch.nn.Module")
    return model


def error_with_tail(exc: BaseException) -> str:
    """``Type: message`` and the last frames of its traceback: the user's, with importlib's
    (frozen ones and ``importlib/__init__.py``) and this module's own frames left out. When
    nothing else is left, no frames: the error came from the call or the import itself (a build
    parameter the callable does not take, a module that is nowhere), and Tessera's or importlib's
    lines would only point away from it; but a SyntaxError raised while compiling keeps them."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen importlib")]
    own = [f for f in frames if not _loader_frame(f.filename)]
    if not own and not isinstance(exc, SyntaxError):
        return f"{type(exc).__name__}: {exc}"
    frames = own or frames
    lines = "".join(traceback.format_list(frames)).rstrip().splitlines()[-TRACEBACK_LINES:]
    tail = "\n".join(lines)
    return f"{type(exc).__name__}: {exc}\nTraceback (last frames):\n{tail}" if tail else f"{type(exc).__name__}: {exc}"


_IMPORTLIB_FOLDER = os.path.dirname(os.path.abspath(importlib.__file__))
_THIS_FILE = os.path.abspath(__file__)


def _loader_frame(filename: str) -> bool:
    """Whether a frame of ``filename`` is Tessera's loading of the user's code rather than the
    code itself: the importlib package's (``importlib/__init__.py``'s ``import_module``) or this
    module's (``load_callable``, ``call_user``)."""
    path = os.path.abspath(filename)
    return os.path.dirname(path) == _IMPORTLIB_FOLDER or path == _THIS_FILE


def loss_of(model: nn.Module, default: Callable[..., Any]) -> Callable[..., Any]:
    """The model's own ``loss(outputs, targets)`` if it defines one, else ``default``.

    Taken from the unwrapped module before DDP/FSDP wrap it (wrappers hide its attributes)."""
    loss = getattr(model, "loss", None)
    return loss if callable(loss) else default
