"""``tessera fork RUN --set optimizer.lr=0.05 --from latest`` and ``tessera continue RUN --max-duration 20ep``."""

# No `from __future__ import annotations`: typer reads the url_option annotation at runtime.

from typing import Annotated, Any, Optional

import typer
import yaml

from cli.output import EXIT_USAGE, JsonOption, emit, err_console, fail


class BadAssignment(ValueError):
    """A ``--set`` that is not ``dotted.key=value``."""


def patch_from_assignments(assignments: list[str]) -> dict[str, Any]:
    """``["optimizer.lr=0.05", "max_duration=4ep"]`` as a nested patch. Values are read as YAML
    scalars or flow collections (``0.05`` a number, ``4ep`` a string, ``null`` deletes the key,
    ``[{name: cutmix}]`` a list)."""
    patch: dict[str, Any] = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise BadAssignment(f"--set {assignment!r}: expected dotted.key=value, e.g. optimizer.lr=0.05")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise BadAssignment(f"--set {assignment!r}: the value is not valid YAML ({exc})") from exc
        node = patch
        *parents, last = key.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise BadAssignment(f"--set {assignment!r}: {part} was already set to a value, not an object")
            node = child
        node[last] = value
    return patch


def fork_source(text: str) -> str | int:
    """``latest``, ``scratch``, or a batch number."""
    if text in ("latest", "scratch"):
        return text
    if text.isdigit():
        return int(text)
    raise BadAssignment(f"--from {text!r}: expected latest, scratch or a checkpoint's batch number")


def register(app: typer.Typer, url_option, call, console) -> None:
    """Add ``fork`` and ``continue`` to ``app`` (``call`` turns API errors into one line and exit 1)."""

    @app.command()
    def fork(run_id: str,
             assignments: Annotated[Optional[list[str]], typer.Option(
                 "--set", help="a change to the parent's spec, dotted.key=value (repeatable), e.g. "
                               "optimizer.lr=0.05, max_duration=4ep, algorithms.label_smoothing.smoothing=0.2 "
                               "(a method by its name); value null removes the key")] = None,
             source: Annotated[str, typer.Option(
                 "--from", help="latest (the parent's newest committed checkpoint), scratch (fresh weights) "
                                "or a checkpoint's batch number")] = "latest",
             url: url_option = None, as_json: JsonOption = False) -> None:
        """Fork a run: a new run with the parent's spec plus your changes, starting from its checkpoint.

        With --json, stdout is the new run's RunView as JSON (the message goes to stderr)."""
        from api.client import Client  # the SDK, imported when a command runs: --help stays fast

        try:
            patch, start = patch_from_assignments(assignments or []), fork_source(source)
        except BadAssignment as exc:
            fail(str(exc), EXIT_USAGE)
        with Client(url) as client:
            child = call(client.fork, run_id, patch, from_=start)
        loaded = f"its checkpoint at batch {child.fork.step}" if child.fork and child.fork.step is not None else \
            "fresh weights"
        out = err_console if as_json else console  # with --json, stdout carries only the JSON
        out.print(f"forked run [bold]{child.id}[/bold] from {run_id} ({loaded}), status {child.status.value}")
        emit(child, as_json=as_json, render=lambda: None)

    @app.command("continue")
    def continue_(run_id: str,
                  max_duration: Annotated[str, typer.Option(
                      "--max-duration", help="the new, longer max_duration in the run's unit, e.g. 20ep")],
                  url: url_option = None, as_json: JsonOption = False) -> None:
        """Train a COMPLETED run on to a longer max_duration as its next attempt.

        With --json, stdout is the run's RunView as JSON (the message goes to stderr)."""
        from api.client import Client

        with Client(url) as client:
            run = call(client.continue_run, run_id, max_duration)
        out = err_console if as_json else console
        out.print(f"run [bold]{run.id}[/bold] continues to {run.spec['max_duration']} as attempt {run.attempt}, "
                  f"status {run.status.value}")
        emit(run, as_json=as_json, render=lambda: None)
