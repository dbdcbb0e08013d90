"""How every ``tessera`` command answers: exit codes, ``--json``, errors on stderr.

One mechanism for all commands, so scripts can rely on it:

- ``call(fn, ...)`` runs an SDK call and turns its failure into a line on stderr and an exit
  code (below); ``fail(message)`` does the same for errors the CLI finds itself.
- ``emit(data, as_json=..., render=...)`` prints either one JSON document on stdout or the
  human view; a read command takes ``as_json: JsonOption`` and ends with ``emit``.

Heavy modules (httpx, the SDK) are imported inside the functions: ``tessera --help`` and shell
completion stay fast.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any, Callable, NoReturn, Optional

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.table import Column, Table

EXIT_OK = 0
EXIT_USER_ERROR = 1  # a run that did not complete, the service refused the request (4xx), a bad file
EXIT_USAGE = 2  # typer/click's own code: unknown option, missing argument, bad option value
EXIT_NOT_FOUND = 3  # 404: no such run, sweep, key or project (or not in the key's projects)
EXIT_UNREACHABLE = 4  # no HTTP answer: connection refused, DNS, timeout
EXIT_SERVICE_ERROR = 5  # the service answered 5xx
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell gives): typer's own code for it too

EPILOG = (
    "Exit codes: 0 ok; 1 a run that did not complete, a request the service refused (4xx, its detail on "
    "stderr) or a bad file; 2 usage error; 3 not found (404); 4 service unreachable; 5 service error (5xx); "
    "130 interrupted (Ctrl-C; a run or sweep the command followed goes on).\n\n"
    "Environment: TESSERA_URL is the service (default: the URL in the credentials file, else "
    "http://127.0.0.1:8000; --url overrides it); "
    "TESSERA_API_KEY is your key (default: the key in the credentials file, which a local `tessera serve` writes; "
    "set but empty counts as unset, so the file's key is sent). The credentials file: $TESSERA_HOME/credentials "
    "if TESSERA_HOME is set, else the nearest .tessera/credentials you own in this folder or one above it.\n\n"
    "Scripts: read commands, and those that create or re-queue something (their answer has its id), take --json "
    "(one JSON document on stdout; messages and errors on stderr).\n\n"
    "Shell completion: tessera --install-completion (bash, zsh, fish, PowerShell); "
    "--show-completion prints the script instead."
)

# No default here: the SDK's Client finds the service (TESSERA_URL, the credentials file, then
# http://127.0.0.1:8000), so the CLI and a notebook in the same folder reach the same one.
def _checked_url(value: str | None) -> str | None:
    """``--url`` (or ``TESSERA_URL``): an http(s) URL with a host, else a usage error naming it."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError for a port that is no number)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is not a URL ({exc}); e.g. http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(f"{value!r} is not an http:// or https:// URL with a host; "
                                 "e.g. http://127.0.0.1:8000")
    return value


UrlOption = Annotated[Optional[str], typer.Option(
    "--url", envvar="TESSERA_URL", show_default=False, callback=_checked_url,
    help="service base URL (default: the URL in .tessera/credentials, else http://127.0.0.1:8000)")]
SetOption = Annotated[Optional[list[str]], typer.Option(
    "--set", help="a change to the file's spec, dotted.key=value (repeatable), e.g. max_duration=1ep, "
                  "optimizer.lr=0.05, algorithms.cutmix.alpha=0.5 (a method by its name); value null removes "
                  "the key (as tessera fork --set)")]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON (one document on stdout) for scripts")]

LIST_PAGE = 500  # the largest page of GET /runs and GET /sweeps: a longer --limit takes several


def limit_value(value: str) -> int | None:
    """A list's ``--limit``: a whole number of at least 1, or ``all`` (None: no limit), else a
    usage error that names the value and what is allowed."""
    if value.strip().lower() == "all":
        return None
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise typer.BadParameter(f"{value!r}: give a whole number of at least 1, or all")
    return limit


# The value a command gets is limit_value's: an int, or None for all.
LimitOption = Annotated[str, typer.Option(
    "--limit", metavar="N|all", callback=limit_value,
    help=f"how many to list, or all (more than {LIST_PAGE} are fetched page after page)")]


def first_items(list_page: Callable[..., Any], limit: int | None, **query: Any) -> list:
    """The first ``limit`` items (every one with None) of a keyset-paged list (``client.list_runs``,
    ``client.list_sweeps``): ``list_page(limit=..., cursor=..., **query)`` page after page of at
    most ``LIST_PAGE``, each asking only for as many as are still wanted."""
    items: list = []
    cursor = None
    while True:
        wanted = LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(items))
        page = list_page(limit=wanted, cursor=cursor, **query)
        items.extend(page.data)
        cursor = page.next_cursor
        if cursor is None or (limit is not None and len(items) >= limit):
            return items

PIPED_WIDTH = 1000  # the width of a console that writes to a pipe or a file (rich's own: 80)


class _Console(Console):
    """A console whose tables a pipe, a file or a script's capture get whole: where its output is
    no terminal and ``COLUMNS`` is not set, rich lays lines out for 80 columns and cuts a wide
    table's cells (``optimizer…``); this one lays them out for ``PIPED_WIDTH`` columns, and a table
    takes only the width it needs. A terminal's width, ``COLUMNS`` and a width set on the console
    are kept as rich has them."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is not None or self._environ.get("COLUMNS", "").isdigit() or _isatty(self.file):
            return size
        return ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


def _isatty(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed file
        return False


console = _Console()
err_console = _Console(stderr=True)

ID_WIDTH = 12  # runs, sweeps and keys: 12 hex digits (service.db.session.new_id)
STATUS_WIDTH = len("RESTARTING")  # the longest run status (a test holds it to api.views.RunStatus)


def kept(header: str, width: int, *, wrap_header: bool = False) -> Column:
    """A table column that a narrow terminal does not cut below ``width`` characters: an id a
    user copies into the next command, a status or figure they read. The other columns give way.
    ``wrap_header``: the header may be cut (a long metric key over short figures)."""
    return Column(header, min_width=width) if wrap_header else Column(header, no_wrap=True, min_width=width)


def listing(*columns: Column | str) -> Table:
    """A list's table: one space between columns, none at the edges, so that 80 columns hold a
    run's id, status and figures whole."""
    return Table(*columns, padding=(0, 1), collapse_padding=True, pad_edge=False)


def none_listed(what: str, options: dict[str, str | None], *notes: str, archived: str = "false") -> None:
    """An empty list's human view: one line on stderr (stdout, which a script may read, keeps the
    table's bare header) that says no ``what`` matched, with the options given that filtered it
    (``--tag nightly``, None: not given) and ``notes`` on why a list can come back empty. The
    list's ``--archived``: its default ("false") hides archived ones, which a note says."""
    import shlex

    if archived == "false":
        notes = (*notes, f"archived {what} are hidden (--archived all lists them too)")
    else:
        options = {**options, "archived": archived}
    given = " ".join(f"--{name} {shlex.quote(value)}" for name, value in options.items() if value is not None)
    line = "; ".join([f"no {what} match {given}" if given else f"no {what}", *notes])
    err_console.print(line, highlight=False, markup=False, soft_wrap=True)


@contextlib.contextmanager
def following(what: str, stop: str, *, doing: str = "following") -> Iterator[None]:
    """Ctrl-C within the block, which follows a run, a log or a sweep, stops only the command: a
    line on stderr says so (``stopped following; run 3f9c... goes on (tessera cancel 3f9c... stops
    it)``) and it exits 130, as typer would have without a word, leaving the user to guess whether
    the run was canceled."""
    try:
        yield
    except KeyboardInterrupt:
        err_console.print(f"stopped {doing}; {what} goes on ({stop} stops it)", highlight=False, markup=False,
                          soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def fail(message: str, code: int = EXIT_USER_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run an SDK call; API and connection errors become one clear message and their exit code,
    and so does input the SDK refuses before sending it (``InvalidInput``: a tag, a note), in
    the same ``field: message (got value)`` lines as the service's 422."""
    import httpx

    from api.errors import ApiError, InvalidInput, format_detail

    try:
        return fn(*args, **kwargs)
    except InvalidInput as exc:
        fail(f"invalid input\n{format_detail(exc.detail)}")
    except ApiError as exc:
        fail(f"HTTP {exc.status_code}\n{format_detail(exc.detail)}", _code_of(exc.status_code))
    except httpx.HTTPStatusError as exc:
        fail(f"HTTP {exc.response.status_code}\n{exc.response.text}", _code_of(exc.response.status_code))
    except httpx.HTTPError as exc:
        url = exc.request.url if _has_request(exc) else None
        where = f" at {url.scheme}://{url.netloc.decode()}" if url else ""
        source = _url_source(f"{url.scheme}://{url.netloc.decode()}") if url else ""
        fail(f"cannot reach the service{where}{source}: {exc or type(exc).__name__}\n"
             "(is it running? set --url or TESSERA_URL)", EXIT_UNREACHABLE)


def _url_source(url: str | None = None) -> str:
    """Where ``url`` came from, when TESSERA_URL did not give it: the credentials file the service
    last wrote it to (a service since stopped, or moved to another port), or the default because
    no credentials file was found (a folder outside the service's checkout)."""
    import os

    from api.client import DEFAULT_URL
    from api.credentials import URL_VARIABLE, credentials_path, find_credentials, find_service_url

    if os.environ.get(URL_VARIABLE):
        return ""
    found = find_service_url()
    if found is None:
        if find_credentials() is None and url == DEFAULT_URL:  # e.g. a folder outside the service's checkout
            home = os.environ.get("TESSERA_HOME")
            searched = f"at {credentials_path()}" if home else "in this folder or one above"
            return (f" (the default: no TESSERA_URL, and no credentials file {searched}; for a service started in "
                    "another folder, set TESSERA_HOME to its .tessera folder, or TESSERA_URL)")
        return ""
    if url is not None and found.rstrip("/") != url:
        return ""
    return f" (the URL in {find_credentials()}, which the service writes as it starts)"


def _code_of(status: int) -> int:
    if status == 404:
        return EXIT_NOT_FOUND
    return EXIT_SERVICE_ERROR if status >= 500 else EXIT_USER_ERROR


def _has_request(exc: Exception) -> bool:
    try:
        return exc.request is not None  # httpx raises RuntimeError when the error carries none
    except RuntimeError:
        return False


def status_value(value: str | None, statuses: str) -> str | None:
    """A ``--status`` option's value: the status of ``api.views.<statuses>`` (``RunStatus``,
    ``SweepStatus``) named in any case, or a usage error that names the value and lists them."""
    if value is None:
        return None
    from api import views

    try:
        return getattr(views, statuses).of(value).value
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def to_jsonable(data: Any) -> Any:
    """Pydantic models (also inside lists and dicts) as their JSON form; the rest unchanged."""
    if hasattr(data, "model_dump"):
        return data.model_dump(mode="json")
    if isinstance(data, (list, tuple)):
        return [to_jsonable(item) for item in data]
    if isinstance(data, dict):
        return {key: to_jsonable(value) for key, value in data.items()}
    return data


def emit(data: Any, *, as_json: bool, render: Callable[[], None]) -> None:
    """With ``as_json``, write ``data`` as one JSON document on stdout; otherwise ``render()``."""
    if not as_json:
        render()
        return
    sys.stdout.write(json.dumps(to_jsonable(data), indent=2, default=str) + "\n")
    sys.stdout.flush()


def needs_extra(extra: str, exc: ModuleNotFoundError) -> NoReturn:
    """A command whose optional dependencies are not installed: say which extra brings them."""
    fail(f"this command needs the {extra} dependencies ({exc.name} is not installed): install Tessera with "
         f"its [{extra}] extra (from a clone: pip install '.[{extra}]')")
