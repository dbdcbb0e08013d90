"""Living with runs from the shell: ``tessera tag RUN +a -b``, ``tessera note RUN "text"``,
``tessera archive RUN``, ``tessera delete RUN [--yes]`` and ``tessera diff RUN1 RUN2``.

``diff`` follows diff(1): exit 0 when the specs are identical, 1 when they differ; an unknown
run or an unreachable service exits as every command does (3, 4: ``cli.output``).
"""

import json
from typing import Annotated

import typer
from rich.table import Table

from cli.output import console, emit, fail


def Client(url: str | None):  # noqa: N802  (the SDK, imported when a command runs: --help stays fast)
    from api.client import Client as SdkClient

    return SdkClient(url)


SweepOption = Annotated[bool, typer.Option("--sweep", help="the id is a sweep's (with its trials)")]


def register(app: typer.Typer, url_option, call) -> None:
    """Add ``tag``, ``note``, ``archive``, ``delete`` and ``diff`` to ``app`` (``call`` turns
    API errors into one line and exit 1)."""

    @app.command(context_settings={"allow_interspersed_args": False})
    def tag(run_id: str, edits: Annotated[list[str], typer.Argument(help="+NAME adds a tag, -NAME removes one")],
            url: url_option = None) -> None:
        """Add and remove a run's tags: tessera tag RUN +baseline -draft."""
        from api.run_edits import apply_tag_edits  # pydantic and the specs: imported when it runs

        with Client(url) as client:
            run = call(client.get_run, run_id)
            try:
                tags = apply_tag_edits(run.tags, edits)
            except ValueError as exc:
                fail(str(exc))
            run = call(client.update_run, run_id, tags=tags)
        console.print(f"run {run.id} tags: {' '.join(run.tags) or '(none)'}", highlight=False)

    @app.command()
    def note(run_id: str, text: Annotated[str, typer.Argument(help='the notes ("" clears them)')],
             url: url_option = None) -> None:
        """Set a run's notes (replacing the old ones)."""
        with Client(url) as client:
            run = call(client.update_run, run_id, notes=text)
        console.print(f"run {run.id} notes {'set' if run.notes else 'cleared'}")

    @app.command()
    def archive(object_id: Annotated[str, typer.Argument(metavar="ID")], sweep: SweepOption = False,
                undo: Annotated[bool, typer.Option("--undo", help="unarchive instead")] = False,
                url: url_option = None) -> None:
        """Hide a run (or with --sweep a sweep and its trials) from default lists; --undo shows it again."""
        with Client(url) as client:
            view = call(client.archive_sweep if sweep else client.archive_run, object_id, archived=not undo)
        console.print(f"{'sweep' if sweep else 'run'} {view.id} {'unarchived' if undo else 'archived'}")

    @app.command()
    def delete(object_id: Annotated[str, typer.Argument(metavar="ID")], sweep: SweepOption = False,
               yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
               url: url_option = None) -> None:
        """Delete an ended run (or with --sweep a sweep and its trials) with its checkpoints, logs and
        exports. Asks first unless --yes."""
        kind = "sweep" if sweep else "run"
        if not yes and not typer.confirm(f"delete {kind} {object_id} and everything it stored?"):
            raise typer.Exit(1)
        with Client(url) as client:
            done = call(client.delete_sweep if sweep else client.delete_run, object_id)
        console.print(f"deleted {kind} {done.id}: {len(done.run_ids)} run(s), {len(done.storage_urls)} storage "
                      f"folder(s)", highlight=False)

    @app.command()
    def diff(run_a: str, run_b: str, url: url_option = None,
             as_json: Annotated[bool, typer.Option("--json", help="print {path: \\[a, b]} as JSON")] = False) -> None:
        """The spec fields that differ between two runs, as dotted paths. Exit 0: identical;
        1: they differ (3: a run not found, as every command)."""
        with Client(url) as client:
            specs = [call(client.get_run, run_a).spec, call(client.get_run, run_b).spec]
        from api.spec_diff import spec_diff

        differences = spec_diff(*specs)

        def render() -> None:
            if not differences:
                console.print("the specs are identical")
                return
            table = Table("field", run_a, run_b)
            for path, (a, b) in differences.items():
                table.add_row(path, json.dumps(a), json.dumps(b))
            console.print(table)

        emit(differences, as_json=as_json, render=render)
        raise typer.Exit(1 if differences else 0)
