"""``tessera logs RUN [-f]``: print an attempt's worker log, and follow it while the run is live."""


import sys
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.output import JsonOption, emit

if TYPE_CHECKING:
    from api.client import Client
    from api.logs import LogsPage


def print_logs(client: "Client", run_id: str, *, attempt: int | None, follow: bool, poll_interval: float = 1.0) -> None:
    """Write the attempt's log to stdout from the start; with ``follow``, keep polling by byte
    offset until the attempt is no longer live."""
    after = 0
    while True:
        page = client.logs(run_id, attempt=attempt, after=after)
        sys.stdout.write(page.text)
        sys.stdout.flush()
        attempt, after = page.attempt, page.next_offset
        if page.next_offset < page.size:
            continue  # more already there: read on without waiting
        if not (follow and page.live):
            return
        time.sleep(poll_interval)


def read_log(client: "Client", run_id: str, *, attempt: int | None) -> "LogsPage":
    """The attempt's whole log as it is now, as one page from offset 0 (for ``--json``)."""
    page = client.logs(run_id, attempt=attempt, after=0)
    text = page.text
    while page.next_offset < page.size:
        page = client.logs(run_id, attempt=page.attempt, after=page.next_offset)
        text += page.text
    return page.model_copy(update={"text": text, "offset": 0})


def register(app: typer.Typer, url_option, default_url: str, call) -> None:
    """Add the ``logs`` command to ``app`` (``call`` turns API errors into one line and exit 1)."""

    @app.command()
    def logs(run_id: str, url: url_option = default_url,
             attempt: Annotated[Optional[int], typer.Option(help="attempt number (default: the newest)")] = None,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing while the run is live")] = False,
             as_json: JsonOption = False,
             ) -> None:
        """Print a run's worker stdout/stderr (one attempt's Ray job log; --json: the log so far as
        one page: run_id, attempt, text, size, live)."""
        from api.client import Client

        if as_json and follow:
            raise typer.BadParameter("--json prints the log so far; leave out --follow", param_hint="--json")
        with Client(url) as client:
            if as_json:
                emit(call(read_log, client, run_id, attempt=attempt), as_json=True, render=lambda: None)
            else:
                call(print_logs, client, run_id, attempt=attempt, follow=follow)
