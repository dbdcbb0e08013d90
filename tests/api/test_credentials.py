"""Where a client finds its API key: the variable, TESSERA_HOME, or the nearest .tessera above it."""

from __future__ import annotations

from api.credentials import KEY_VARIABLE, find_api_key, write_credentials


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


def test_a_credentials_file_another_user_owns_is_passed_over(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    monkeypatch.delenv("TESSERA_HOME", raising=False)
    write_credentials(tmp_path / ".tessera" / "credentials", "tsk_planted")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("os.getuid", lambda: 4242)  # as another user than the file's owner
    assert find_api_key() is None


def test_the_client_finds_the_service_where_the_cli_does(monkeypatch):
    from api.client import DEFAULT_URL, Client

    monkeypatch.delenv("TESSERA_URL", raising=False)
    assert Client(api_key="tsk_x").base_url == DEFAULT_URL
    monkeypatch.setenv("TESSERA_URL", "http://tessera.lab:9000/")
    assert Client(api_key="tsk_x").base_url == "http://tessera.lab:9000"
    assert Client("http://other:1", api_key="tsk_x").base_url == "http://other:1"
