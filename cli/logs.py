"""``tessera logs RUN [-f]``: print an attempt's worker log, and follow it while the run is live."""


import sys
import time
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from api.client import Client


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


def register(app: typer.Typer, url_option, default_url: str, call) -> None:
    """Add the ``logs`` command to ``app`` (``call`` turns API errors into one line and exit 1)."""

    @app.command()
    def logs(run_id: str, url: url_option = default_url,
             attempt: Annotated[Optional[int], typer.Option(help="attempt number (default: the newest)")] = None,
             follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing while the run is live")] = False,
             ) -> None:
        """Print a run's worker stdout/stderr (one attempt's Ray job log)."""
        from api.client import Client

        with Client(url) as client:
            call(print_logs, client, run_id, attempt=attempt, follow=follow)
