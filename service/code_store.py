"""Code packages in object storage: ``{project storage}/code/{sha256}.zip``, written once.

The name is the content's sha256, so a package is stored once however often it is uploaded,
and a worker can check what it fetched. The service only stores bytes here: it never unpacks,
imports or runs them (``api.code_package.inspect_package`` reads the zip's directory).
"""

from __future__ import annotations

import io
import secrets
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import PurePosixPath

from fastapi import Request
from fsspec.core import url_to_fs

from api.code_modules import ModuleTree
from api.module_names import MAX_SOURCE_BYTES, defined_names
from api.code_package import CodePackageError, CodeView, inspect_package
from service.bounded_storage import DEFAULT_STORAGE_TIMEOUT_S, bounded
from service.storage_paths import code_url, project_storage_url

CHUNK_BYTES = 1 << 20  # what one storage read hands a download
NAMES_CACHED = 256  # packages whose importable names and modules a store remembers (a digest's never change)
MODULES_CACHED = 1024  # modules whose top-level names a store remembers


def write_whole(fs, path: str, data: bytes) -> None:
    """Write ``data`` so that readers see the old file or the whole new one, never half: a local
    file is written aside and renamed; an object store's PUT is atomic already."""
    if "file" in fs.protocol:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        partial = f"{path}.{secrets.token_hex(4)}.partial"
        fs.pipe_file(partial, data)
        fs.mv(partial, path)
    else:
        fs.pipe_file(path, data)


class CodeStore:
    """Put, check and describe packages under one storage URL (``file://`` or ``s3://``)."""

    def __init__(self, storage_url: str, *, timeout_s: float = DEFAULT_STORAGE_TIMEOUT_S):
        self.storage_url = storage_url.rstrip("/")
        self.fs, self.root = url_to_fs(self.storage_url)
        self.timeout_s = timeout_s  # each storage call gives up after this (StorageTimeout)
        # importable_names and module_tree, newest last
        self._names: OrderedDict[str, tuple[frozenset[str], ModuleTree]] = OrderedDict()
        self._names_lock = threading.Lock()
        # module_names, newest last: (digest, module) -> (file, names or None)
        self._modules: OrderedDict[tuple[str, str], tuple[str, frozenset[str] | None] | None] = OrderedDict()

    def _path(self, digest: str) -> str:
        return url_to_fs(code_url(self.storage_url, digest))[1]

    def exists(self, digest: str) -> bool:
        path = self._path(digest)
        self.fs.invalidate_cache(path)  # another service replica may have stored it since
        return bounded(f"checking {path}", self.timeout_s, self.fs.exists, path)

    def put(self, digest: str, data: bytes) -> bool:
        """Store ``data`` (already checked) under ``digest``; False if it was there already."""
        if self.exists(digest):
            return False
        path = self._path(digest)
        bounded(f"writing {path}", self.timeout_s, write_whole, self.fs, path, data)
        return True

    def describe(self, digest: str) -> CodeView | None:
        """The stored package's view, or None if there is none."""
        if not self.exists(digest):
            return None
        path = self._path(digest)
        return inspect_package(bounded(f"reading {path}", self.timeout_s, self.fs.cat_file, path))

    def importable_names(self, digest: str) -> frozenset[str] | None:
        """The top-level names ``import`` finds in the stored package once the workers put it
        first on ``sys.path`` (``ModuleTree.top_level``): its packages, its modules (extension
        modules too) and its folders of Python files without ``__init__.py`` (namespace packages); None
        if there is no such package or it cannot be read as one (the worker then says why). Read
        once per digest (its content never changes)."""
        read = self._read_names(digest)
        return None if read is None else read[0]

    def module_tree(self, digest: str) -> ModuleTree | None:
        """The modules and packages below the stored package's top level
        (``api.code_modules.ModuleTree``, from the zip's file names: nothing is unpacked or
        imported); None as for ``importable_names``. Read once per digest."""
        read = self._read_names(digest)
        return None if read is None else read[1]

    def _read_names(self, digest: str) -> tuple[frozenset[str], ModuleTree] | None:
        with self._names_lock:
            if digest in self._names:
                self._names.move_to_end(digest)
                return self._names[digest]
        if not self.exists(digest):
            return None
        path = self._path(digest)
        data = bounded(f"reading {path}", self.timeout_s, self.fs.cat_file, path)
        try:
            inspect_package(data)  # a package it would refuse to store: none, as one not stored
            tree = ModuleTree.of(zipfile.ZipFile(io.BytesIO(data)).namelist())
        except (CodePackageError, zipfile.BadZipFile):
            return None
        found = (tree.top_level(), tree)
        with self._names_lock:
            self._names[digest] = found
            while len(self._names) > NAMES_CACHED:
                self._names.popitem(last=False)
        return found

    def module_names(self, digest: str, module: str, tree: ModuleTree) -> tuple[str, frozenset[str] | None] | None:
        """(the file of ``module`` in the stored package, the names its source binds at its top
        level: ``api.module_names.defined_names``, None when they cannot be known), or None when
        the module is no Python source there (a namespace package, a ``.pyc``, an extension module)
        or the package cannot be read. Parsed, never imported; read once per digest and module."""
        key = (digest, module)
        with self._names_lock:
            if key in self._modules:
                self._modules.move_to_end(key)
                return self._modules[key]
        kind = tree.kind(module)
        file = module.replace(".", "/") + ("/__init__.py" if kind == "package" else ".py")
        found = None
        if kind in ("package", "module") and self.exists(digest):
            path = self._path(digest)
            data = bounded(f"reading {path}", self.timeout_s, self.fs.cat_file, path)
            found = _parsed(data, file)
        with self._names_lock:
            self._modules[key] = found
            while len(self._modules) > MODULES_CACHED:
                self._modules.popitem(last=False)
        return found

    def size(self, digest: str) -> int | None:
        """The stored package's size in bytes, or None if there is none."""
        path = self._path(digest)
        self.fs.invalidate_cache(path)
        try:
            return bounded(f"reading the size of {path}", self.timeout_s, self.fs.size, path)
        except FileNotFoundError:
            return None

    def chunks(self, digest: str, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """The stored package's bytes, as uploaded, in chunks of at most ``chunk_bytes``; every
        storage call bounded, so a store that hangs mid-download cuts the answer short (the client
        checks the sha256 and keeps nothing) instead of holding it open. Opened on the first chunk."""
        path = self._path(digest)
        file = bounded(f"opening {path}", self.timeout_s, self.fs.open, path, "rb")
        try:
            while data := bounded(f"reading {path}", self.timeout_s, file.read, chunk_bytes):
                yield data
        finally:
            file.close()


def project_code_store(request: Request, project: str) -> CodeStore:
    """The ``CodeStore`` of ``project``, under its storage prefix (``storage_paths.project_storage_url``),
    where that project's workers fetch packages from: a package stored for one project is not
    visible to another. Built once per project and app."""
    stores = request.app.state.__dict__.setdefault("code_stores", {})
    if project not in stores:
        settings = request.app.state.settings
        stores[project] = CodeStore(project_storage_url(settings.storage_url, project),
                                    timeout_s=settings.storage_timeout_s)
    return stores[project]


def _parsed(data: bytes, file: str) -> tuple[str, frozenset[str] | None] | None:
    """(``file``, the names its source binds) from the zip ``data``; None when the workers would
    not import that source: the zip holds none, holds it twice under one name once unpacked
    ("a/b.py" and "./a/b.py": which one lands is the unpacker's), or holds an extension module
    beside it (``b.cpython-311-x86_64-linux-gnu.so``, which Python's finder tries first); and
    when the zip cannot be read."""
    where, _, file_name = file.rpartition("/")
    name = file_name.removesuffix(".py")  # "__init__" for a package
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as package:
            # Entry names as the workers' unpacking reads them ("./a//b.py" is a/b.py).
            entries = {}
            for info in package.infolist():
                entries.setdefault("/".join(PurePosixPath(info.filename).parts), []).append(info)
            found = entries.get(file, [])
            extension = any(path.rpartition("/")[0] == where and _is_extension(path.rpartition("/")[2], name)
                            for path in entries)
            if len(found) != 1 or extension:
                return None
            if found[0].file_size > MAX_SOURCE_BYTES:
                return file, None
            return file, defined_names(package.read(found[0]))
    # NotImplementedError: a compression method zipfile cannot read; zlib.error, EOFError: corrupt data.
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, zlib.error, EOFError):
        return None


def _is_extension(file_name: str, module: str) -> bool:
    """Whether ``file_name`` is an extension module named ``module`` (``nets.so``, ``nets.pyd``,
    ``nets.cpython-311-x86_64-linux-gnu.so``)."""
    return file_name.startswith(module + ".") and file_name.endswith((".so", ".pyd"))
