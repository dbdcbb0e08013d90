"""Your own model: fetch the run's code package, import ``model.import``, build, and its loss.

The contract (small, like Composer's ``ComposerModel``):

- ``model: {import: "my_project.nets:build", params: {...}}`` names a callable that Tessera
  calls on every worker as ``build(num_classes=C, in_channels=K, **params)`` for images
  (``(N, K, H, W)`` float tensors) or ``build(vocab_size=V, **params)`` for text (``(N, T)``
  token ids; the model returns ``(N, T, V)`` next-token logits). It returns an ``nn.Module``
  whose ``forward(inputs)`` returns logits ``(N, C)``.
- If the module has a ``loss(outputs, targets)`` method, the loop uses it instead of the
  task's default (soft cross-entropy). ``targets`` are class indices, or per-class
  probabilities ``(N, C)`` when CutMix, MixUp or label smoothing are on: accept both or leave
  those methods out. Evaluation always reports cross-entropy and accuracy of the logits.
- Everything else is ordinary PyTorch: surgery methods (BlurPool, ChannelsLast, Factorize,
  ALiBi) change the modules they recognise and say on the run when they found none.

How the code gets to the workers: the service stores the package at
``{storage}/code/{sha256}.zip``; before building, each worker fetches it with fsspec, checks
its sha256, unpacks it once per machine under ``$TESSERA_CODE_CACHE`` (default
``/tmp/tessera-code-{uid}``) and puts it first on ``sys.path``. The cache is trusted only as far
as this user alone can change it: a cache folder another user owns or can write to is refused (a
shared ``/tmp`` lets anyone make a folder first), a missing one is made private (0700), and a
package's folder counts only if it is private and holds the marker its unpacking wrote after the
bytes matched the digest; any other is unpacked again.

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

import fcntl
import importlib
import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch.nn as nn
from fsspec.core import url_to_fs

from api.code_package import CodePackageError, safe_extract, sha256_hex
from api.model_specs import ImportedModelSpec
from workers.paths import code_package_url

TRACEBACK_LINES = 20


class UserCodeError(RuntimeError):
    """The run's code could not be fetched, imported or called; the message says which and
    ends with the traceback's tail. One string, so it pickles across Ray."""


VERIFIED_MARKER = ".tessera-sha256"  # in a package's cache folder: the digest its bytes matched


def code_cache_dir() -> Path:
    """``$TESSERA_CODE_CACHE``, else a folder of this user's in the temporary directory."""
    default = Path(tempfile.gettempdir()) / f"tessera-code-{os.getuid()}"
    return Path(os.environ.get("TESSERA_CODE_CACHE") or default)


def _private(path: Path) -> str | None:
    """Why ``path`` is no folder only this user can change (``lstat``: a link does not count),
    or None when it is one."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        return "is not a folder (a link, or a file)"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"can be written by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _own_cache(root: Path) -> Path:
    """``root``, made private (0700) if missing; ``UserCodeError`` unless only this user can
    change it: anyone who could would choose what this process imports under a digest's name."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        problem = _private(root)
    except OSError as exc:
        raise UserCodeError(f"the code cache {root} cannot be used: {exc}; set TESSERA_CODE_CACHE to a folder "
                            "of your own") from None
    if problem is not None:
        raise UserCodeError(f"the code cache {root} {problem}, so this process would import what others put "
                            "there; chmod 700 it, or set TESSERA_CODE_CACHE to a private folder of your own")
    return root


def _verified(target: Path) -> bool:
    """Whether ``target`` is a package folder unpacked by this user from bytes that matched its
    digest: a private folder (inside a private cache) holding the marker the unpacking wrote."""
    try:
        return _private(target) is None and (target / VERIFIED_MARKER).read_text() == target.name
    except OSError:
        return False


def install_code(digest: str, *, storage_url: str | None,
                 fetch: Callable[[], tuple[bytes, str]] | None = None) -> Path:
    """Make the package ``digest`` importable in this process; returns its folder.

    Fetched only when this machine's cache lacks it: from ``{storage_url}/code/{digest}.zip``,
    or by ``fetch()`` when given (``workers.export.load_model``: from the service), which returns
    the bytes and where they came from (for messages) and raises ``UserCodeError`` when it cannot.
    Either way the bytes are checked against ``digest`` before they are unpacked."""
    target = _own_cache(code_cache_dir()) / digest
    if not _verified(target):
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
    return target


def read_package(digest: str, url: str) -> tuple[bytes, str]:
    """The bytes at ``url`` (fsspec), and ``url``; ``UserCodeError`` when they cannot be read."""
    try:
        fs, path = url_to_fs(url)
        return fs.cat_file(path), url
    except Exception as exc:  # FileNotFoundError, a storage outage, missing credentials, ...
        raise UserCodeError(f"code.digest {digest}: cannot fetch {url}: {type(exc).__name__}: {exc}") from None


def _unpack(data: bytes, target: Path) -> None:
    """Unpack verified bytes into a private folder with the marker, then, holding the package's
    lock (workers on one machine race here), rename it into place unless another worker's
    verified copy got there first. A folder there that is not verified (an older cache's, one cut
    short, someone's) is moved aside and removed; a verified one is never touched, so a process
    importing from it keeps it."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name[:12]}-", dir=target.parent))
    try:
        safe_extract(data, staging)
        (staging / VERIFIED_MARKER).write_text(target.name)
        with open(target.parent / f".{target.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if _verified(target):
                return  # another worker's copy: the same bytes
            if os.path.lexists(target):
                stale = target.with_name(f".stale-{target.name[:12]}-{os.getpid()}-{time.monotonic_ns()}")
                target.rename(stale)
                if stale.is_symlink() or not stale.is_dir():
                    stale.unlink()
                else:
                    shutil.rmtree(stale, ignore_errors=True)
            staging.rename(target)
    except CodePackageError as exc:
        raise UserCodeError(f"code package {target.name}: {exc}") from None
    except OSError as exc:
        raise UserCodeError(f"code package {target.name}: cannot unpack it into {target.parent}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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


def load_callable(spec: ImportedModelSpec) -> Callable[..., Any]:
    """The callable ``spec.import_path`` names; ``UserCodeError`` with the traceback's tail otherwise."""
    try:
        module = importlib.import_module(spec.module_name)
    except Exception as exc:
        raise UserCodeError(f"model.import {spec.import_path!r}: importing module {spec.module_name!r} failed: "
                            f"{_error_with_tail(exc)}") from None
    target = getattr(module, spec.attribute, None)
    if not callable(target):
        found = "is not callable" if target is not None else "does not exist"
        raise UserCodeError(f"model.import {spec.import_path!r}: {spec.attribute!r} {found} in "
                            f"{getattr(module, '__file__', spec.module_name)}")
    return target


def build_user_model(spec: ImportedModelSpec, *, num_classes: int, in_channels: int, domain: str) -> nn.Module:
    """Call the user's builder with the contract's arguments; check that it returned a module."""
    build = load_callable(spec)
    kwargs = {"vocab_size": num_classes} if domain == "text" else {"num_classes": num_classes,
                                                                   "in_channels": in_channels}
    try:
        model = build(**kwargs, **spec.params)
    except Exception as exc:
        raise UserCodeError(f"model.import {spec.import_path!r}: calling it with "
                            f"{', '.join(f'{k}={v!r}' for k, v in {**kwargs, **spec.params}.items())} failed: "
                            f"{_error_with_tail(exc)}") from None
    if not isinstance(model, nn.Module):
        raise UserCodeError(f"model.import {spec.import_path!r} returned a {type(model).__name__}, not a "
                            "torch.nn.Module")
    return model


def _error_with_tail(exc: BaseException) -> str:
    """``Type: message`` and the last frames of its traceback (importlib's own frames left out)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen importlib")]
    lines = "".join(traceback.format_list(frames)).rstrip().splitlines()[-TRACEBACK_LINES:]
    tail = "\n".join(lines)
    return f"{type(exc).__name__}: {exc}\nTraceback (last frames):\n{tail}" if tail else f"{type(exc).__name__}: {exc}"


def loss_of(model: nn.Module, default: Callable[..., Any]) -> Callable[..., Any]:
    """The model's own ``loss(outputs, targets)`` if it defines one, else ``default``.

    Taken from the unwrapped module before DDP/FSDP wrap it (wrappers hide its attributes)."""
    loss = getattr(model, "loss", None)
    return loss if callable(loss) else default
