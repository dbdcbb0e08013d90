"""The private Ray of a local DDP run (``workers.local_ray``): its workers drop exactly Ray Train's
"Failed to query Ray Train Controller actor state" warning, its files go to a folder of its own
that goes with it, the signal handlers Ray sets are undone, and a Ctrl-C or SIGTERM as it starts
waits for the start."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from workers.local_ray import (CLEANER_LOGGER, SETUP_HOOK, private_temp_dir, quiet_placement_group_cleaner,
                               ray_start_uninterrupted, signal_handlers_restored, worker_temp_env, worker_tmpdir)


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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_as_ray_starts_is_raised_once_it_has_started_and_a_second_one_at_once(signum):
    """``ray.init`` stopped part-way left Ray's agents running, and SIGTERM's own handler, which
    it sets first, ended ``tessera train`` with status 15 (its driver's C++ crash handler, set
    later in it, with SIGABRT)."""
    import sys

    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    def mine(signum, frame):  # tessera train's (cli.main._sigterm_as_interrupt), and Python's for SIGINT
        raise KeyboardInterrupt

    crash_handler_off, sets_sigterm = ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER, ray_utils.set_sigterm_handler
    previous = {s: signal.signal(s, mine) for s in (signal.SIGTERM, signal.SIGINT)}
    started = []
    try:
        with pytest.raises(KeyboardInterrupt), ray_start_uninterrupted():
            ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # ray.init's first step
            assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True  # read as its core worker starts
            os.kill(os.getpid(), signum)
            started.append("the rest of the start")
        assert started == ["the rest of the start"]
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGINT) is mine
        assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is crash_handler_off
        assert ray_utils.set_sigterm_handler is sets_sigterm

        with pytest.raises(KeyboardInterrupt), ray_start_uninterrupted():  # asked twice: stopped at once
            os.kill(os.getpid(), signum)
            os.kill(os.getpid(), signum)
            started.append("not reached")
        assert started == ["the rest of the start"] and signal.getsignal(signum) is mine
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
