"""``tessera logs RUN [-f]``: print an attempt's worker log, and follow it while the run is live
(``tessera sweeps logs SWEEP`` reads a sweep driver's log the same way)."""


import contextlib
import re
import sys
import time
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer

from cli.output import JsonOption, emit, following

if TYPE_CHECKING:
    from api.client import Client
    from api.logs import LogPage

# Terminal escape sequences (colours, bold): ESC [ parameters, then a letter.
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Reads one page: (attempt or None for the newest, byte offset) -> page
PageReader = Callable[[Optional[int], int], "LogPage"]


def print_logs(read: PageReader, *, attempt: int | None, follow: bool, poll_interval: float = 1.0) -> None:
    """Write the attempt's log to stdout from the start; with ``follow``, keep polling by byte
    offset while it is live. Without an ``attempt`` (the newest), following goes on to the
    attempts that follow it (a worker-group restart, a resume), each announced on stderr, until
    the run ends."""
    page = read(attempt, 0)
    plain = not sys.stdout.isatty()  # a file or a pipe: no colour codes (Ray's, Rich's) to read through
    while True:
        sys.stdout.write(TERMINAL_CODES.sub("", page.text) if plain else page.text)
        sys.stdout.flush()
        if page.next_offset < page.size:  # more already there: read on without waiting
            page = read(page.attempt, page.next_offset)
        elif follow and page.live:
            time.sleep(poll_interval)
            page = read(page.attempt, page.next_offset)
        elif follow and attempt is None and page.attempts > page.attempt:  # the run went on
            sys.stderr.write(f"--- attempt {page.attempt + 1} ---\n")
            page = read(page.attempt + 1, 0)
        else:
            return


def read_log(read: PageReader, *, attempt: int | None) -> "LogPage":
    """The attempt's whole log as it is now, as one page from offset 0 (for ``--json``)."""
    page = read(attempt, 0)
    text = page.text
    while page.next_offset < page.size:
        page = read(page.attempt, page.next_offset)
        text += page.text
    return page.model_copy(update={"text": text, "offset": 0})


def refuse_json_with_follow(as_json: bool, follow: bool) -> None:
    if as_json and follow:
        raise typer.BadParameter("--json prints the log so far; leave out --follow", param_hint="--json")


def show_logs(read: PageReader, *, attempt: int | None, follow: bool, as_json: bool, call) -> None:
    """What ``tessera logs`` and ``tessera sweeps logs`` print (``call`` turns API errors into
    one line and exit 1); ``refuse_json_with_follow`` first."""
    if as_json:
        emit(call(read_log, read, attempt=attempt), as_json=True, render=lambda: None)
    else:
        call(print_logs, read, attempt=attempt, follow=follow)


def run_pages(client: "Client", run_id: str) -> PageReader:
    return lambda attempt, after: client.logs(run_id, attempt=attempt, after=after)


def sweep_pages(client: "Client", sweep_id: str) -> PageReader:
    return lambda attempt, after: client.sweep_logs(sweep_id, attempt=attempt, after=after)


def register(app: typer.Typer, url_option, call) -> None:
    """Add the ``logs`` command to ``app`` (``call`` turns API errors into one line and exit 1)."""

    @app.command()
    def logs(run_id: str, url: url_option = None,
             attempt: Annotated[Optional[int], typer.Option(help="attempt number (default: the newest)")] = None,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing while the run is live, through its next attempts")] = False,
             as_json: JsonOption = False,
             ) -> None:
        """Print a run's worker stdout/stderr (one attempt's Ray job log; --json: the log so far as
        one page: run_id, attempt, text, size, live)."""
        from api.client import Client

        refuse_json_with_follow(as_json, follow)
        goes_on = following(f"run {run_id}", f"tessera cancel {run_id}", doing="following the log")
        with Client(url) as client, goes_on if follow else contextlib.nullcontext():
            show_logs(run_pages(client, run_id), attempt=attempt, follow=follow, as_json=as_json, call=call)
