"""Settings: embedded defaults from TESSERA_HOME, clear errors, and no secrets in logs."""

from __future__ import annotations

import pytest

from service.settings import Settings, SettingsError, load_settings


def test_defaults_live_under_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path))
    settings = load_settings()
    assert settings.database_url == f"sqlite:///{tmp_path}/tessera.db"
    assert settings.storage_url == f"file://{tmp_path}/storage"
    assert settings.public_url == "http://127.0.0.1:8000" and settings.embedded_ray
    assert settings.ray_num_cpus >= 4


def test_environment_overrides_and_public_url_follows_host_and_port(monkeypatch):
    monkeypatch.setenv("TESSERA_PORT", "9100")
    monkeypatch.setenv("TESSERA_RAY_ADDRESS", "http://10.0.0.5:8265")
    settings = load_settings(host="0.0.0.0")
    assert settings.public_url == "http://0.0.0.0:9100" and settings.ray_address == "http://10.0.0.5:8265"
    assert not settings.embedded_ray


@pytest.mark.parametrize(("host", "local_url"), [
    ("127.0.0.1", "http://127.0.0.1:9100"),
    ("0.0.0.0", "http://127.0.0.1:9100"),  # every interface: a client here uses loopback
    ("::", "http://[::1]:9100"),
    ("fe80::1", "http://[fe80::1]:9100"),
    ("tessera.lab", "http://tessera.lab:9100"),
])
def test_the_local_url_is_where_a_client_on_this_machine_reaches_the_service(host, local_url):
    settings = Settings(host=host, port=9100, public_url="http://user:secret@tessera.internal:8000")
    assert settings.local_url == local_url  # never the workers' URL, which may carry a secret or not resolve here


def test_blank_ray_address_means_embedded(monkeypatch):
    monkeypatch.setenv("TESSERA_RAY_ADDRESS", "")
    assert load_settings().embedded_ray


@pytest.mark.parametrize(("env", "value", "expected"), [
    ("TESSERA_RAY_ADDRESS", "ray://head:10001", "TESSERA_RAY_ADDRESS must be the Ray dashboard"),
    ("TESSERA_DATABASE_URL", "mysql://root:hunter2@db/tessera", "TESSERA_DATABASE_URL must be a sqlite"),
    ("TESSERA_PORT", "70000", "TESSERA_PORT: Input should be less than or equal to 65535"),
    ("TESSERA_DISPATCH_INTERVAL_S", "0", "TESSERA_DISPATCH_INTERVAL_S: Input should be greater than 0"),
])
def test_invalid_settings_name_the_variable_and_hide_secrets(monkeypatch, env, value, expected):
    monkeypatch.setenv(env, value)
    monkeypatch.setenv("TESSERA_STORAGE_URL", "s3://key:s3cret@bucket/prefix")
    with pytest.raises(SettingsError) as info:
        load_settings()
    assert expected in str(info.value)
    assert "hunter2" not in str(info.value) and "s3cret" not in str(info.value)


def test_repr_and_redacted_view_never_show_passwords():
    settings = Settings(database_url="postgresql+psycopg://tessera:hunter2@db:5432/tessera")
    for text in (repr(settings), str(settings), str(settings.redacted())):
        assert "hunter2" not in text and "postgresql+psycopg://tessera:***@db:5432/tessera" in text
    assert settings.database_url.endswith("hunter2@db:5432/tessera")  # the real value is intact


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_because_it_would_lose_runs(url):
    with pytest.raises(SettingsError, match="^invalid Tessera settings:\n  TESSERA_DATABASE_URL: an in-memory"):
        load_settings(database_url=url)


def test_several_api_processes_need_postgresql():
    with pytest.raises(SettingsError, match="TESSERA_WORKERS=2 needs PostgreSQL"):
        load_settings(workers=2)
    with pytest.raises(SettingsError, match="TESSERA_WORKERS=2 needs PostgreSQL"):
        load_settings(workers=2, database_url="postgresql://db/tessera")  # another driver than psycopg 3
    assert load_settings(workers=2, database_url="postgresql+psycopg://db/tessera").workers == 2
    with pytest.raises(SettingsError, match="TESSERA_WORKERS: Input should be greater than or equal to 1"):
        load_settings(workers=0)


def first_start(tmp_path, monkeypatch, secret: str):
    """A service's first start on an empty SQLite database with ``TESSERA_BOOTSTRAP_API_KEY``;
    returns its key store."""
    from service.access import AccessStore
    from service.bootstrap import ensure_admin_key
    from service.db.engine import make_engine, migrate
    from service.db.session import Database

    monkeypatch.setenv("TESSERA_HOME", str(tmp_path))
    monkeypatch.setenv("TESSERA_BOOTSTRAP_API_KEY", secret)
    settings = Settings()
    engine = make_engine(settings.database_url)
    migrate(engine)
    access = AccessStore(Database(engine))
    ensure_admin_key(access, settings)
    return access


@pytest.mark.parametrize("secret", ["not-a-key", "tsk_" + "x" * 253, "tsk_with space"])
def test_a_bootstrap_key_the_service_could_never_accept_stops_the_first_start(tmp_path, monkeypatch, secret):
    with pytest.raises(ValueError, match=r"must be 'tsk_' and then letters, digits, '_' or '-', at most 256"):
        first_start(tmp_path, monkeypatch, secret)


def test_a_bootstrap_key_of_256_characters_from_a_file_with_its_newline_is_the_first_admin_key(tmp_path, monkeypatch,
                                                                                             capsys, caplog):
    secret = "tsk_" + "k" * 252
    access = first_start(tmp_path, monkeypatch, secret + "\n")
    assert access.authenticate(secret) is not None
    # Said once, with the URL clients will use and where the key is.
    printed = capsys.readouterr().out
    assert printed == (f"Tessera: created an admin API key for http://127.0.0.1:8000; it is in {tmp_path}/credentials, "
                       "with the URL (the CLI, the SDK and notebooks read both from there)\n")
    assert not [r for r in caplog.records if "created an admin API key" in r.getMessage()]
