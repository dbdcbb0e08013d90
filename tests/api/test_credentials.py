"""Where a client finds its API key: the variable, TESSERA_HOME, or the nearest .tessera above it."""

from __future__ import annotations

import os
import stat

from api.credentials import (KEY_VARIABLE, URL_VARIABLE, find_api_key, find_service_url, read_credentials,
                             record_service_url, write_credentials)


def test_a_client_in_a_subfolder_finds_the_key_of_the_service_started_above_it(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv("TESSERA_HOME", raising=False)
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_root")
    notebooks = tmp_path / "examples" / "notebooks"
    notebooks.mkdir(parents=True)
    monkeypatch.chdir(notebooks)
    assert find_api_key() == "tsk_root"
    # The nearest one wins: a service started in examples/ has its own home.
    write_credentials(tmp_path / "examples" / ".tessera" / "credentials", "tsk_examples")
    assert find_api_key() == "tsk_examples"


def test_the_variable_and_an_explicit_home_come_before_the_search(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_found")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TESSERA_HOME", str(elsewhere))
    assert find_api_key() is None  # TESSERA_HOME names the one place to look
    monkeypatch.delenv("TESSERA_HOME")
    assert find_api_key() == "tsk_found"
    monkeypatch.setenv(KEY_VARIABLE, "tsk_variable")
    assert find_api_key() == "tsk_variable"
    monkeypatch.setenv(KEY_VARIABLE, "")  # set but empty counts as unset, as tessera --help and the README say
    assert find_api_key() == "tsk_found"


def test_a_credentials_file_another_user_owns_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv("TESSERA_HOME", raising=False)
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_planted")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("os.getuid", lambda: 4242)  # as another user than the file's owner
    assert find_api_key() is None


def test_the_client_finds_the_service_where_the_cli_does(tmp_path, monkeypatch):
    from api.client import DEFAULT_URL, Client

    monkeypatch.delenv("TESSERA_URL", raising=False)
    monkeypatch.delenv("TESSERA_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path / ".tessera"))  # no file found above tmp_path counts
    assert Client(api_key="tsk_x").base_url == DEFAULT_URL
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_root", url="http://127.0.0.1:8123/")
    assert Client(api_key="tsk_x").base_url == "http://127.0.0.1:8123"
    monkeypatch.setattr("os.getuid", lambda: 4242)  # another user's file: its URL would get this user's key
    assert Client(api_key="tsk_x").base_url == DEFAULT_URL
    monkeypatch.setenv("TESSERA_URL", "http://tessera.lab:9000/")
    assert Client(api_key="tsk_x").base_url == "http://tessera.lab:9000"
    assert Client("http://other:1", api_key="tsk_x").base_url == "http://other:1"


def test_the_service_url_comes_from_the_variable_else_the_file_the_key_comes_from(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv(URL_VARIABLE, raising=False)
    monkeypatch.delenv("TESSERA_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_root", url="http://127.0.0.1:8123")
    assert find_service_url() == "http://127.0.0.1:8123"
    monkeypatch.setenv(URL_VARIABLE, "http://tessera.lab:9000")
    assert find_service_url() == "http://tessera.lab:9000"
    monkeypatch.delenv(URL_VARIABLE)
    # An owned folder without a key is passed over for the key, so for the URL too: both come from one file.
    sub = tmp_path / "sub"
    (sub / ".tessera").mkdir(parents=True)
    (sub / ".tessera" / "credentials").write_text(f"{URL_VARIABLE}=http://elsewhere:1\n")
    monkeypatch.chdir(sub)
    assert (find_api_key(), find_service_url()) == ("tsk_root", "http://127.0.0.1:8123")


def test_a_later_start_rewrites_the_url_and_keeps_the_key_and_its_mode(tmp_path):
    path = tmp_path / "home" / "credentials"
    write_credentials(path, "tsk_first", url="http://127.0.0.1:8000")
    before = path.read_text()
    assert record_service_url(path, "http://127.0.0.1:8000") is False and path.read_text() == before
    assert record_service_url(path, "http://127.0.0.1:8123") is True
    assert read_credentials(path) == "tsk_first" and read_credentials(path, URL_VARIABLE) == "http://127.0.0.1:8123"
    assert path.read_text().count(f"{URL_VARIABLE}=") == 1 and path.read_text().startswith("# Tessera API key")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(path.parent) == ["credentials"]  # the file written beside it was renamed over it
    # A file from before URLs were written gets one, before its key line, and loses the old comment.
    path.write_text(f"# the key\n# service: http://old\n{KEY_VARIABLE}=tsk_old\n")
    assert record_service_url(path, "http://127.0.0.1:8124") is True
    assert path.read_text().splitlines() == ["# the key", f"{URL_VARIABLE}=http://127.0.0.1:8124",
                                             f"{KEY_VARIABLE}=tsk_old"]


def test_a_linked_file_is_rewritten_where_it_lies_and_one_that_cannot_be_written_is_left(tmp_path, monkeypatch):
    real = tmp_path / "secrets" / "credentials"
    write_credentials(real, "tsk_linked", url="http://127.0.0.1:8000")
    link = tmp_path / "home" / "credentials"
    link.parent.mkdir()
    link.symlink_to(real)
    assert record_service_url(link, "http://127.0.0.1:8123") is True
    assert link.is_symlink() and read_credentials(real, URL_VARIABLE) == "http://127.0.0.1:8123"
    monkeypatch.setattr("os.replace", lambda *args: (_ for _ in ()).throw(PermissionError(13, "read-only")))
    assert record_service_url(real, "http://127.0.0.1:9000") is False  # logged; the service starts anyway
    assert read_credentials(real, URL_VARIABLE) == "http://127.0.0.1:8123"
    assert sorted(os.listdir(real.parent)) == ["credentials"]  # no half-written file left beside it


def test_a_file_without_a_key_or_owned_by_another_user_is_left_alone(tmp_path, monkeypatch):
    missing = tmp_path / "missing" / "credentials"
    assert record_service_url(missing, "http://x:1") is False and not missing.parent.exists()
    keyless = tmp_path / "credentials"
    keyless.write_text("# nothing here\n")
    assert record_service_url(keyless, "http://x:1") is False and keyless.read_text() == "# nothing here\n"
    theirs = tmp_path / "theirs" / "credentials"
    write_credentials(theirs, "tsk_theirs", url="http://a:1")
    monkeypatch.setattr("os.getuid", lambda: 4242)
    assert record_service_url(theirs, "http://x:1") is False
    assert read_credentials(theirs, URL_VARIABLE) == "http://a:1"
