"""``tessera keys`` and ``tessera projects``: API keys and projects (see README, "Authentication
and projects"). The CLI's own key comes from ``TESSERA_API_KEY`` or the credentials file
(``api.credentials.find_api_key``)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from cli.output import ID_WIDTH, JsonOption, UrlOption, emit, err_console, kept, listing

keys_app = typer.Typer(no_args_is_help=True, help="API keys: create (shown once), list, revoke.")
projects_app = typer.Typer(no_args_is_help=True, help="Projects: create, list, set quotas.")

# ``--unset`` names: the option's name, and the API's field it clears.
QUOTA_OPTIONS = {"max-running-runs": "max_running_runs", "max-workers": "max_workers", "max-gpus": "max_gpus",
                 "default-max-wall-time": "default_max_wall_time_s", "max-wall-time-cap": "max_wall_time_cap_s",
                 "max-duration-cap": "max_duration_caps"}


def _main():
    from cli import main  # the shared client and error handling

    return main


@keys_app.command("create")
def create_key(
    project: Annotated[str, typer.Option(help="the project the key acts in; '*': every project (for an admin of "
                                              "every project only)")],
    role: Annotated[str, typer.Option(help="viewer (read), member (submit, cancel, resume), admin (keys, quotas)")]
    = "member",
    name: Annotated[str, typer.Option(help="a label to tell keys apart")] = "key",
    url: UrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a key; its secret is printed once and never stored by the service.

    With --json, stdout is the created key as JSON as the API returns it, the secret in "key"
    (the message goes to stderr)."""
    main = _main()
    key = main._call(main._client(url).create_key, project, role, name)
    out = err_console if as_json else main.console  # with --json, stdout carries only the JSON
    shown = 'the secret ("key" in the JSON on stdout) is shown only now' if as_json else "the secret is shown only now:"
    out.print(f"key {key['id']} ({role} of {project}); {shown}", highlight=False, markup=False)
    emit(key, as_json=as_json, render=lambda: print(key["key"]))


@keys_app.command("list")
def list_keys(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Keys you administer (never their secrets)."""
    main = _main()
    table = listing(kept("id", ID_WIDTH), "name", "prefix", "roles", "created", "revoked")
    keys = main._call(main._client(url).list_keys)
    for key in keys:
        roles = ", ".join(f"{p}:{r}" for p, r in sorted(key["roles"].items()))
        table.add_row(key["id"], key["name"], key["prefix"] + "…", roles, str(key["created_at"])[:19],
                      str(key["revoked_at"])[:19] if key["revoked_at"] else "-")
    emit(keys, as_json=as_json, render=lambda: main.console.print(table))


@keys_app.command("revoke")
def revoke_key(key_id: str, url: UrlOption = None) -> None:
    """Revoke a key: its next request is refused (401)."""
    main = _main()
    key = main._call(main._client(url).revoke_key, key_id)
    main.console.print(f"key {key['id']} revoked at {key['revoked_at']}", highlight=False)


@projects_app.command("create")
def create_project(name: str, url: UrlOption = None) -> None:
    """Create a project (needs the admin key of every project: the first key)."""
    main = _main()
    main._call(main._client(url).create_project, name)
    main.console.print(f"project {name} created", highlight=False)


@projects_app.command("list")
def list_projects(url: UrlOption = None, as_json: JsonOption = False) -> None:
    """Projects your key has a role in, with that role and the quotas."""
    main = _main()
    table = Table("name", "your role", "max_running_runs", "max_workers", "max_gpus")
    projects = main._call(main._client(url).list_projects)
    for project in projects:
        quota = project["quota"]
        table.add_row(project["name"], project["role"] or "-",
                      *[str(quota[k]) if quota[k] is not None else "-" for k in ("max_running_runs", "max_workers",
                                                                                 "max_gpus")])
    emit(projects, as_json=as_json, render=lambda: main.console.print(table))


@projects_app.command("quota")
def set_quota(
    name: str,
    max_running_runs: Annotated[Optional[int], typer.Option(help="runs admitted at once")] = None,
    max_workers: Annotated[Optional[int], typer.Option(help="workers of admitted runs, together")] = None,
    max_gpus: Annotated[Optional[int], typer.Option(help="GPUs of admitted runs, together")] = None,
    default_max_wall_time: Annotated[Optional[int], typer.Option(
        help="seconds: the wall-clock limit of runs that set none")] = None,
    max_wall_time_cap: Annotated[Optional[int], typer.Option(
        help="seconds: the longest max_wall_time a run may ask for (every-project admin only)")] = None,
    max_duration_cap: Annotated[Optional[list[str]], typer.Option(
        help="UNIT=N, e.g. ep=20000: the largest max_duration per unit (ep, ba, sp, tok); repeatable; the "
             "units not given keep their caps (every-project admin only)")] = None,
    unset: Annotated[Optional[list[str]], typer.Option(
        help=f"remove this limit (repeatable): {', '.join(QUOTA_OPTIONS)}")] = None,
    url: UrlOption = None,
) -> None:
    """Change a project's quotas: the options given are set, --unset ones removed, the others
    kept. Needs the project's admin."""
    main = _main()
    given = {"max-running-runs": max_running_runs, "max-workers": max_workers, "max-gpus": max_gpus,
             "default-max-wall-time": default_max_wall_time, "max-wall-time-cap": max_wall_time_cap,
             "max-duration-cap": max_duration_cap or None}
    changes = {QUOTA_OPTIONS[option]: value for option, value in given.items() if value is not None}
    if max_duration_cap:
        try:
            changes["max_duration_caps"] = {unit: int(n) for unit, n in (item.split("=", 1) for item in max_duration_cap)}
        except ValueError:
            raise typer.BadParameter(f"{max_duration_cap!r}: give UNIT=N, e.g. ep=20000", param_hint="--max-duration-cap")
    for option in unset or []:
        if option not in QUOTA_OPTIONS:
            raise typer.BadParameter(f"{option!r} is not a quota; one of {', '.join(QUOTA_OPTIONS)}",
                                     param_hint="--unset")
        if given[option] is not None:
            raise typer.BadParameter(f"--{option} is both given and unset; give one", param_hint="--unset")
        changes[QUOTA_OPTIONS[option]] = None
    if not changes:
        raise typer.BadParameter("give at least one quota to set or --unset", param_hint="options")
    project = main._call(main._client(url).update_quota, name, **changes)
    limits = ", ".join(f"{field} {value}" for field, value in project["quota"].items() if value is not None)
    main.console.print(f"project {name} quotas: {limits or 'no limits'}", highlight=False)
