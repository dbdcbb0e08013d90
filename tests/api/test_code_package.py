"""Packing a folder into a code package, and the checks the service and workers make on one."""

from __future__ import annotations

import io
import os
import zipfile

import pytest

from api import code_package
from api.code_package import CodePackageError, inspect_package, pack_directory, safe_extract, sha256_hex


def write_project(root, files: dict[str, str | bytes]):
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


PROJECT = {"__init__.py": "", "nets.py": "def build(**kw):\n    return None\n", "util/__init__.py": "",
           "util/helpers.py": "X = 1\n"}


def test_packing_is_deterministic_and_content_addressed(tmp_path):
    first = write_project(tmp_path / "a" / "my_project", PROJECT)
    second = write_project(tmp_path / "b" / "my_project", dict(reversed(PROJECT.items())))
    os.utime(second / "nets.py", (0, 0))  # other timestamps, other creation order: same bytes
    one, two = pack_directory(first), pack_directory(second)
    assert one.data == two.data and one.digest == two.digest == sha256_hex(one.data)
    assert one.files == ["my_project/__init__.py", "my_project/nets.py", "my_project/util/__init__.py",
                         "my_project/util/helpers.py"]
    (second / "nets.py").write_text("def build(**kw):\n    return 1\n")
    assert pack_directory(second).digest != one.digest


def test_a_folder_without_init_is_a_root_of_packages(tmp_path):
    root = write_project(tmp_path / "src", {"pkg/__init__.py": "", "pkg/m.py": "", "tool.py": ""})
    package = pack_directory(root)
    assert package.files == ["pkg/__init__.py", "pkg/m.py", "tool.py"]
    assert inspect_package(package.data).top_level == ["pkg", "tool"]


def test_gitignore_patterns_and_caches_are_left_out(tmp_path):
    root = write_project(tmp_path / "my_project", {
        **PROJECT, ".gitignore": "# data\n*.ckpt\ndata/\n/build\ndocs/*.md\n!keep.ckpt\n",
        "model.ckpt": "x", "keep.ckpt": "x", "data/train.csv": "1,2", "build/out.py": "", "sub/build/kept.py": "",
        "docs/notes.md": "", "docs/index.rst": "", "__pycache__/nets.cpython-311.pyc": "", "util/x.pyc": "",
        ".git/HEAD": "ref"})
    names = pack_directory(root).files
    assert "my_project/sub/build/kept.py" in names and "my_project/docs/index.rst" in names
    for left_out in ("model.ckpt", "keep.ckpt", "data/train.csv", "build/out.py", "docs/notes.md",
                     "__pycache__/nets.cpython-311.pyc", "util/x.pyc", ".git/HEAD"):
        assert f"my_project/{left_out}" not in names


def test_a_symlink_out_of_the_tree_is_refused_and_one_inside_is_stored_as_a_file(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("key")
    root = write_project(tmp_path / "my_project", PROJECT)
    (root / "alias.py").symlink_to(root / "nets.py")
    package = pack_directory(root)
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        assert archive.read("my_project/alias.py") == (root / "nets.py").read_bytes()
    (root / "leak.txt").symlink_to(outside)
    with pytest.raises(CodePackageError, match=r"leak.txt is a symbolic link to .*secret.txt, outside"):
        pack_directory(root)
    (root / "leak.txt").unlink()
    (root / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(CodePackageError, match="elsewhere is a symbolic link"):
        pack_directory(root)


def test_size_caps_name_the_largest_files(tmp_path, monkeypatch):
    root = write_project(tmp_path / "my_project", {**PROJECT, "weights.bin": os.urandom(4096)})
    monkeypatch.setattr(code_package, "MAX_UNPACKED_BYTES", 2048)
    with pytest.raises(CodePackageError, match=r"more than 0 MiB; the largest: weights.bin"):
        pack_directory(root)
    monkeypatch.setattr(code_package, "MAX_UNPACKED_BYTES", 10**6)
    with pytest.raises(CodePackageError, match="the package is .* MiB, more than"):
        pack_directory(root, max_bytes=1024)


def test_a_folder_without_python_is_refused(tmp_path):
    with pytest.raises(CodePackageError, match="no Python file"):
        pack_directory(write_project(tmp_path / "docs", {"README.md": "hi"}))
    with pytest.raises(CodePackageError, match="not a folder"):
        pack_directory(tmp_path / "missing")


def zip_of(entries: dict[str, bytes], *, symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name)
            if name == symlink:
                info.external_attr = 0o120777 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


@pytest.mark.parametrize(("data", "problem"), [
    (b"PK\x03\x04 not really", "not a zip archive"),
    (zip_of({"../evil.py": b""}), "'../evil.py' leaves the package"),
    (zip_of({"pkg/__init__.py": b"", "pkg/../../x.py": b""}), "leaves the package"),
    (zip_of({"/etc/cron.d/x.py": b""}), "absolute"),
    (zip_of({"pkg/__init__.py": b"", "pkg/link": b"/etc/passwd"}, symlink="pkg/link"), "symbolic link"),
    (zip_of({"README.md": b"", "data/x.csv": b""}), "no top-level package"),
])
def test_inspect_refuses_what_is_not_a_safe_package(data, problem):
    with pytest.raises(CodePackageError, match=problem):
        inspect_package(data)


def test_safe_extract_unpacks_an_inspected_package(tmp_path):
    package = pack_directory(write_project(tmp_path / "my_project", PROJECT))
    safe_extract(package.data, tmp_path / "out")
    assert (tmp_path / "out" / "my_project" / "util" / "helpers.py").read_text() == "X = 1\n"


def test_with_code_digest_keeps_the_requirements_and_leaves_a_bad_code_for_validation_to_name():
    body = {"name": "r", "code": {"requirements": ["einops==0.8.1"]}}
    assert code_package.with_code_digest(body, "d") == {"name": "r", "code": {"requirements": ["einops==0.8.1"],
                                                                              "digest": "d"}}
    assert body == {"name": "r", "code": {"requirements": ["einops==0.8.1"]}}  # a copy
    assert code_package.with_code_digest({"name": "r"}, "d")["code"] == {"digest": "d"}
    assert code_package.with_code_digest({"code": None}, "d")["code"] == {"digest": "d"}
    assert code_package.with_code_digest({"code": ["einops"]}, "d") == {"code": ["einops"]}


@pytest.mark.parametrize("requirement, why", [
    ("--index-url https://elsewhere", "is a pip option"),
    ("-e .", "is a pip option"),
    ("einops===", "is not a PEP 508 requirement"),
    ("other-1.0-py3-none-any.whl", "names a file"),
    ("foo @ ./rel.whl", "points at a relative path"),
    ("", "must be 1 to 300 characters"),
])
def test_a_requirement_pip_would_read_as_an_option_or_a_local_file_is_refused(requirement, why):
    from pydantic import ValidationError

    from api.model_specs import CodeRef

    with pytest.raises(ValidationError) as caught:
        CodeRef(digest="a" * 64, requirements=["einops==0.8.1", requirement])
    [error] = caught.value.errors()
    assert error["loc"] == ("requirements", 1) and why in error["msg"] and "einops==0.8.1" in error["msg"]


def test_absolute_urls_and_plain_names_are_requirements():
    from api.model_specs import CodeRef

    kept = ["einops==0.8.1", "foo @ file:///wheels/foo-1.0-py3-none-any.whl", "bar @ git+https://host/bar",
            "scipy>=1.11,<2; python_version >= '3.10'"]
    assert CodeRef(digest="a" * 64, requirements=[f" {r} " for r in kept]).requirements == kept
