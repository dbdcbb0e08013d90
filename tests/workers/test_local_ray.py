"""The private Ray of a local DDP run (``workers.local_ray``): its workers drop exactly Ray Train's
"Failed to query Ray Train Controller actor state" warning, its files go to a folder of its own
that goes with it, and the signal handlers Ray sets are undone."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from workers.local_ray import (CLEANER_LOGGER, SETUP_HOOK, private_temp_dir, quiet_placement_group_cleaner,
                               signal_handlers_restored, worker_temp_env, worker_tmpdir)


@pytest.fixture
def cleaner_logger():
    """Ray Train's cleaner logger with this test's filters removed afterwards."""
    logger = logging.getLogger(CLEANER_LOGGER)
    filters = list(logger.filters)
    yield logger
    logger.filters[:] = filters


def test_the_setup_hook_drops_the_cleaner_s_poll_warning_and_keeps_its_others(cleaner_logger, caplog):
    module, name = SETUP_HOOK.rsplit(".", 1)
    hook = getattr(__import__(module, fromlist=[name]), name)  # as Ray loads it in each worker
    hook()
    quiet_placement_group_cleaner()  # a second call (a reused worker process) adds no second filter
    assert len(cleaner_logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger=CLEANER_LOGGER):
        # Ray's own message (placement_group_cleaner.py:85-88), then another of the same logger.
        cleaner_logger.warning("Failed to query Ray Train Controller actor state. "
                               "State API may be temporarily unavailable. Continuing to monitor.")
        cleaner_logger.warning("Failed to clean up placement group: %s", "gone")
    assert [record.getMessage() for record in caplog.records] == ["Failed to clean up placement group: gone"]


def test_the_private_temp_dir_holds_the_workers_tmpdir_and_goes_even_when_the_run_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray would put /tmp/ray
    with pytest.raises(KeyboardInterrupt), private_temp_dir() as temp_dir:
        assert os.path.dirname(temp_dir) == str(tmp_path)
        assert os.path.isdir(worker_tmpdir(temp_dir))
        os.makedirs(os.path.join(temp_dir, "session_2026-01-01_00-00-00_000000_1", "logs"))
        (tmp_path / "pymp-elsewhere").mkdir()  # not this run's: left alone
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["pymp-elsewhere"]


def test_the_signal_handlers_ray_sets_are_undone_at_once_and_after_the_block():
    def mine(signum, frame):
        raise KeyboardInterrupt

    def ray_s(signum, frame):
        raise SystemExit(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        sigint_before = signal.getsignal(signal.SIGINT)
        with signal_handlers_restored() as put_back:
            signal.signal(signal.SIGTERM, ray_s)  # ray.init's
            put_back()
            assert signal.getsignal(signal.SIGTERM) is mine
            signal.signal(signal.SIGINT, ray_s)  # Ray Train's fit()
        assert signal.getsignal(signal.SIGINT) is sigint_before
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_workers_caches_stay_where_they_were_outside_the_run_s_temp_dir(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TESSERA_CODE_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir reads TMPDIR again
    with private_temp_dir() as temp_dir:
        env = worker_temp_env(temp_dir)
        assert env["TMPDIR"] == worker_tmpdir(temp_dir)
        for cache in ("TORCHINDUCTOR_CACHE_DIR", "TESSERA_CODE_CACHE"):  # torch.compile's, code packages'
            assert os.path.dirname(env[cache]) == str(tmp_path) and not env[cache].startswith(temp_dir), env
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/caches/inductor")  # one the user chose stays theirs
    assert worker_temp_env(str(tmp_path))["TORCHINDUCTOR_CACHE_DIR"] == "/caches/inductor"
