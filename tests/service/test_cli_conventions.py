"""The CLI's conventions (cli/output.py) against the real app on a loopback port (no Ray): every
read command's --json parses, exit codes tell errors apart, help documents it, completion works."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
import typer
from typer.testing import CliRunner

from api.errors import ApiError
from api.views import RunStatus
from cli.main import app
from cli.output import EXIT_NOT_FOUND, EXIT_SERVICE_ERROR, EXIT_UNREACHABLE, EXIT_USAGE, EXIT_USER_ERROR, call
from tests.conftest import REPO_ROOT, free_port
from tests.dashboard.conftest import LocalService

runner = CliRunner()


def tessera(*args: str, **env: str):
    return runner.invoke(app, list(args), prog_name="tessera", env=env or None)


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> LocalService:
    with LocalService(tmp_path_factory.mktemp("cli-conventions")) as service:
        yield service


@pytest.fixture
def url(service) -> str:
    return service.url


def test_every_read_command_prints_json_that_parses(url, tmp_path):
    submitted = tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--json", "--url", url)
    assert submitted.exit_code == 0, submitted.output
    run = json.loads(submitted.stdout)  # stdout holds nothing but the RunView
    assert run["status"] == "QUEUED" and run["spec"]["name"]

    listed = json.loads(tessera("runs", "--json", "--url", url).stdout)
    assert run["id"] in [r["id"] for r in listed]
    shown = json.loads(tessera("show", run["id"], "--json", "--url", url).stdout)
    assert shown["id"] == run["id"] and shown["status"] == "QUEUED"
    keys = json.loads(tessera("keys", "list", "--json", "--url", url).stdout)
    assert keys and {"id", "prefix", "roles"} <= set(keys[0]) and "key" not in keys[0]  # never a secret
    projects = json.loads(tessera("projects", "list", "--json", "--url", url).stdout)
    assert "default" in [p["name"] for p in projects]
    log = json.loads(tessera("logs", run["id"], "--json", "--url", url).stdout)  # queued: nothing logged yet
    assert (log["run_id"], log["text"], log["offset"], log["live"]) == (run["id"], "", 0, True)
    assert json.loads(tessera("exports", run["id"], "--json", "--url", url).stdout) == []  # nothing exported yet
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps({"name": "cli-sweep", "base": shown["spec"],
                                      "search": {"algorithms": {"sets": [[], ["channels_last"]]}}}))
    assert tessera("sweeps", "submit", str(sweep_file), "--url", url).exit_code == 0
    sweep = json.loads(tessera("sweeps", "list", "--json", "--url", url).stdout)[0]
    log = json.loads(tessera("sweeps", "logs", sweep["id"], "--json", "--url", url).stdout)  # queued: no job yet
    assert (log["sweep_id"], log["text"], log["attempt"], log["source"]) == (sweep["id"], "", 1, "none")


def test_a_submit_again_with_its_idempotency_key_says_it_queued_nothing_new(url, tmp_path):
    spec = str(REPO_ROOT / "examples" / "digits_resnet.yaml")
    first = tessera("submit", spec, "--idempotency-key", "nightly-7", "--json", "--url", url)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["replayed"] is False and "submitted run" in first.stderr
    again = tessera("submit", spec, "--idempotency-key", "nightly-7", "--url", url)
    run_id = json.loads(first.stdout)["id"]
    assert again.exit_code == 0
    # One line however narrow the terminal (a script reads it): Rich does not wrap it.
    assert f"run {run_id}" in again.stdout and "submitted earlier with this --idempotency-key: nothing new queued" \
        in again.stdout.splitlines()[0]
    assert json.loads(tessera("submit", spec, "--json", "--url", url).stdout)["replayed"] is False  # a fresh key
    sweep_file = tmp_path / "sweep.json"
    base = json.loads(first.stdout)["spec"]
    sweep_file.write_text(json.dumps({"name": "cli-replay", "base": base, "search": {"algorithms": {"sets": [[]]}}}))
    made = tessera("sweeps", "submit", str(sweep_file), "--idempotency-key", "sweep-7", "--json", "--url", url)
    replayed = tessera("sweeps", "submit", str(sweep_file), "--idempotency-key", "sweep-7", "--json", "--url", url)
    assert json.loads(made.stdout)["replayed"] is False and json.loads(replayed.stdout)["replayed"] is True
    assert json.loads(made.stdout)["id"] == json.loads(replayed.stdout)["id"]
    assert "submitted earlier" in " ".join(replayed.stderr.split())


def test_set_changes_the_files_spec_before_it_is_sent_or_checked(url, tmp_path):
    spec = str(REPO_ROOT / "examples" / "digits_resnet.yaml")
    submitted = tessera("submit", spec, "--set", "max_duration=1ep", "--set", "optimizer.lr=0.05",
                        "--set", "algorithms.cutmix.alpha=0.5", "--json", "--url", url)
    assert submitted.exit_code == 0, submitted.output
    sent = json.loads(submitted.stdout)["spec"]
    assert (sent["max_duration"], sent["optimizer"]["lr"]) == ("1ep", 0.05)
    assert [a["alpha"] for a in sent["algorithms"] if a["name"] == "cutmix"] == [0.5]  # a method by its name
    bad = tessera("submit", spec, "--set", "max_duration", "--url", url)
    assert bad.exit_code == EXIT_USAGE and "expected dotted.key=value" in bad.stderr
    refused = tessera("train", spec, "--set", "max_duration=soon", "--no-checkpoints")
    assert refused.exit_code == EXIT_USER_ERROR and "max_duration" in refused.stderr and "'soon'" in refused.stderr
    sweep_file = tmp_path / "sweep.json"
    sweep_file.write_text(json.dumps({"name": "cli-set", "base": sent, "search": {"algorithms": {"sets": [[]]}}}))
    sweep = tessera("sweeps", "submit", str(sweep_file), "--set", "base.max_duration=2ep", "--set", "base.name=other",
                    "--set", "base.algorithms.cutmix.alpha=0.25", "--json", "--url", url)
    assert sweep.exit_code == 0, sweep.output
    base = json.loads(sweep.stdout)["spec"]["base"]  # the base merges as a run's spec does, not as a nested object
    assert (base["max_duration"], base["name"], base["optimizer"]) == ("2ep", "other", sent["optimizer"])
    assert [a["alpha"] for a in base["algorithms"] if a["name"] == "cutmix"] == [0.25]
    past_end = tessera("submit", spec, "--set", "algorithms.7.alpha=1", "--url", url)
    assert past_end.exit_code == EXIT_USAGE and "--set algorithms.7: the spec's algorithms has 3 item(s)" in \
        " ".join(past_end.stderr.split()) and "Traceback" not in past_end.output


def test_a_submit_without_code_of_a_module_in_this_folder_is_warned_of(url, tmp_path, monkeypatch):
    """The spec imports a folder that lies here, and no --code sends it: the workers would look
    for it installed and fail a minute later. Submitted all the same (it may be installed there)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tabular").mkdir()
    (tmp_path / "tabular" / "__init__.py").write_text("")
    spec = yaml.safe_load((REPO_ROOT / "examples" / "digits_resnet.yaml").read_text())
    spec["model"] = {"import": "tabular.models:build"}
    spec["algorithms"] = []
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    warned = tessera("submit", "spec.yaml", "--url", url)
    assert warned.exit_code == 0, warned.output
    assert ("warning: model.import 'tabular.models:build' names 'tabular', which is in this folder, but no --code was "
            "given: the workers will import it only if it is installed there (--code tabular sends it with the run)"
            ) in " ".join(warned.stderr.split())
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "unshipped", "base": spec, "search": {"algorithms": {"sets": [[]]}}}))
    swept = tessera("sweeps", "submit", str(sweep_file), "--url", url)
    assert swept.exit_code == 0 and "warning: base.model.import 'tabular.models:build'" in swept.stderr, swept.output
    shutil.rmtree(tmp_path / "tabular")  # not here: nothing to say
    quiet = tessera("submit", "spec.yaml", "--url", url)
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr, quiet.output
    (tmp_path / "tabular.py").write_text("")  # a module here: --code . would pack the whole folder, not suggested
    module = tessera("submit", "spec.yaml", "--url", url)
    assert "(--code DIR sends it with the run, DIR a folder that holds tabular and little else)" in " ".join(
        module.stderr.split()), module.output
    (tmp_path / "tabular.py").unlink()
    # A metric of your own, in the spec file's folder rather than this one.
    project = tmp_path / "project"
    (project / "metrics").mkdir(parents=True)
    spec["model"] = {"name": "simple_cnn"}
    spec["eval_metrics"] = [{"import": "metrics.ranking:pr_auc"}]
    (project / "spec.yaml").write_text(yaml.safe_dump(spec))
    beside = tessera("submit", "project/spec.yaml", "--url", url)
    assert beside.exit_code == 0, beside.output
    assert ("warning: eval_metrics[0].import 'metrics.ranking:pr_auc' names 'metrics', which is in project, the "
            "spec's folder, but no --code was given: the workers will import it only if it is installed there "
            "(--code project sends it with the run)") in " ".join(beside.stderr.split())  # a namespace folder


def test_a_missing_object_exits_3_and_a_refused_request_1_with_the_apis_detail_on_stderr(url):
    missing = tessera("show", "doesnotexist", "--json", "--url", url)
    assert missing.exit_code == EXIT_NOT_FOUND
    assert "HTTP 404" in missing.stderr and "doesnotexist" in missing.stderr and missing.stdout == ""
    refused = tessera("projects", "create", "Not A Name", "--url", url)
    assert refused.exit_code == EXIT_USER_ERROR and "HTTP 422" in refused.stderr


def test_input_the_sdk_refuses_before_sending_is_one_line_per_field_not_a_traceback(url):
    submitted = json.loads(tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--json",
                                   "--url", url).stdout)
    bad_tag = tessera("tag", "--url", url, submitted["id"], "+bad!tag")  # edits come last: -NAME removes a tag
    assert bad_tag.exit_code == EXIT_USER_ERROR, bad_tag.output
    # Named as typed (not as tags[i] of the list the edits make), before anything is sent.
    assert "error: tag edit '+bad!tag': tag 'bad!tag' is not allowed" in bad_tag.stderr
    assert "Traceback" not in bad_tag.output
    long_note = tessera("note", submitted["id"], "x" * 10_001, "--url", url)
    assert long_note.exit_code == EXIT_USER_ERROR and "notes:" in long_note.stderr
    # A status in any case; a wrong one is a usage error that lists them.
    assert json.loads(tessera("runs", "--status", "queued", "--json", "--url", url).stdout)
    wrong = tessera("runs", "--status", "done", "--url", url)
    assert wrong.exit_code == EXIT_USAGE and "'done' is not a run status; one of QUEUED" in wrong.output


def test_on_an_80_column_terminal_the_runs_table_keeps_ids_and_statuses_whole(url, monkeypatch):
    from cli import output

    submitted = json.loads(tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--json",
                                   "--url", url).stdout)
    monkeypatch.setattr(output.console, "_width", 80)  # the other columns give way: the id is copied, not read
    listed = tessera("runs", "--url", url)
    assert submitted["id"] in listed.stdout and "QUEUED" in listed.stdout, listed.stdout
    assert output.STATUS_WIDTH == max(len(status.value) for status in RunStatus)  # RESTARTING is whole too


def test_piped_tables_are_not_cut_to_80_columns_unless_columns_says_so(url, monkeypatch):
    """Rich lays out for 80 columns where stdout is no terminal (a pipe, a file, this capture): a
    run's name and tags were cut (``…``). There they take the width they need; COLUMNS still wins."""
    from cli import output

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(output.console, "_width", None)  # as built without COLUMNS
    name = "a-run-name-long-enough-that-eighty-columns-cut-it"
    submitted = tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--set", f"name={name}",
                        "--json", "--url", url)
    assert submitted.exit_code == 0, submitted.output
    tagged = tessera("tag", "--url", url, json.loads(submitted.stdout)["id"], "+piped-tables-stay-whole")
    assert tagged.exit_code == 0, tagged.output
    piped = tessera("runs", "--tag", "piped-tables-stay-whole", "--url", url)
    row = next(line for line in piped.stdout.splitlines() if name in line)
    assert "piped-tables-stay-whole" in row and "…" not in piped.stdout and len(row) > 80, piped.stdout
    narrow = tessera("runs", "--tag", "piped-tables-stay-whole", "--url", url, COLUMNS="80")
    assert name not in narrow.stdout and max(len(line) for line in narrow.stdout.splitlines()) <= 80


def test_on_a_terminal_the_console_keeps_rich_s_width():
    from rich.console import Console

    from cli.output import PIPED_WIDTH, _Console

    class Terminal:
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            """Nothing is buffered: ``write`` keeps nothing."""

    assert _Console(file=Terminal(), _environ={}).width == Console(file=Terminal(), _environ={}).width != PIPED_WIDTH
    assert _Console(file=Terminal(), width=100).width == 100


def test_an_empty_list_says_on_stderr_which_filters_and_orders_left_nothing(url):
    """A mistyped best:KEY lists nothing (the service lists only runs that reported KEY): the
    table's bare header stays on stdout for scripts, the reason goes to stderr."""
    empty = tessera("runs", "list", "--tag", "nightly", "--name", "no such run", "--order-by", "best:eval/acc",
                    "--url", url)
    assert empty.exit_code == 0 and "┃id" in empty.stdout and "no runs" not in empty.stdout
    hint = " ".join(empty.stderr.split())
    assert hint.startswith("no runs match --tag nightly --name 'no such run' --order-by best:eval/acc; only runs "
                           "that reported eval/acc are listed"), hint
    assert "archived runs are hidden" in hint and len(empty.stderr.strip().splitlines()) == 1
    archived = tessera("runs", "--status", "completed", "--archived", "true", "--url", url)
    assert " ".join(archived.stderr.split()) == "no runs match --status COMPLETED --archived true"
    assert json.loads(tessera("runs", "--tag", "nightly", "--json", "--url", url).stdout) == []
    assert tessera("runs", "--tag", "nightly", "--json", "--url", url).stderr == ""  # [] says it: no hint
    sweeps = tessera("sweeps", "list", "--name", "no such sweep", "--url", url)
    assert sweeps.exit_code == 0 and "no sweeps" not in sweeps.stdout
    assert " ".join(sweeps.stderr.split()) == ("no sweeps match --name 'no such sweep'; archived sweeps are hidden "
                                               "(--archived all lists them too)")
    assert tessera("submit", str(REPO_ROOT / "examples" / "digits_resnet.yaml"), "--url", url).exit_code == 0
    assert tessera("runs", "--url", url).stderr == ""  # a list with runs: nothing said


def test_a_usage_error_exits_2(url):
    bad_set = tessera("fork", "some-run", "--set", "optimizer.lr", "--url", url)
    assert bad_set.exit_code == EXIT_USAGE and "expected dotted.key=value" in bad_set.stderr and bad_set.stdout == ""
    assert tessera("runs", "--limit", "many", "--url", url).exit_code == EXIT_USAGE
    assert tessera("no-such-command").exit_code == EXIT_USAGE
    assert tessera("logs", "some-run", "--json", "--follow", "--url", url).exit_code == EXIT_USAGE
    assert tessera("sweeps", "logs", "some-sweep", "--json", "--follow", "--url", url).exit_code == EXIT_USAGE


def test_an_unreachable_service_exits_4_and_names_the_url():
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = tessera("runs", "--json", TESSERA_URL=nowhere)  # the URL from the environment
    assert result.exit_code == EXIT_UNREACHABLE
    assert f"cannot reach the service at {nowhere}" in result.stderr and result.stdout == ""


def test_without_url_the_cli_finds_the_service_where_its_credentials_file_says(service, tmp_path, monkeypatch):
    """The service wrote its URL beside its key: no --url or TESSERA_URL is needed on another port."""
    monkeypatch.delenv("TESSERA_URL", raising=False)
    monkeypatch.delenv("TESSERA_API_KEY", raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(service.home))
    assert not service.url.endswith(":8000")
    listed = tessera("projects", "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert "default" in [p["name"] for p in json.loads(listed.stdout)]
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert tessera("projects", "list", "--url", nowhere).exit_code == EXIT_UNREACHABLE  # --url still wins


def test_the_default_url_is_named_as_the_default_when_no_credentials_file_was_found(tmp_path, monkeypatch):
    """A shell in a project folder outside the service's checkout finds no credentials file: the
    error says the URL was the default and how to point the CLI at the service."""
    monkeypatch.delenv("TESSERA_URL", raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path))  # no credentials there
    monkeypatch.setattr("api.client.DEFAULT_URL", f"http://127.0.0.1:{free_port()}")  # nothing answers
    result = tessera("runs")
    assert result.exit_code == EXIT_UNREACHABLE
    assert (f"(the default: no TESSERA_URL, and no credentials file at {tmp_path / 'credentials'}; for a service "
            "started in another folder, set TESSERA_HOME to its .tessera folder, or TESSERA_URL)") in result.stderr


def test_a_url_from_a_credentials_file_is_named_when_nothing_answers_there_and_a_bad_url_is_a_usage_error(
        tmp_path, monkeypatch):
    from api.credentials import write_credentials

    monkeypatch.delenv("TESSERA_URL", raising=False)
    monkeypatch.setenv("TESSERA_HOME", str(tmp_path))
    stopped = f"http://127.0.0.1:{free_port()}"  # a service that wrote its URL, then stopped
    write_credentials(tmp_path / "credentials", "tsk_gone", url=stopped)
    result = tessera("runs")
    assert result.exit_code == EXIT_UNREACHABLE
    assert f"cannot reach the service at {stopped} (the URL in {tmp_path / 'credentials'}" in result.stderr
    for bad in ("localhost:8000", "http://:::8000", "ftp://host/"):
        refused = tessera("runs", "--url", bad)
        assert refused.exit_code == EXIT_USAGE and "Invalid value for '--url'" in refused.output, refused.output
        assert bad in " ".join(refused.output.replace("│", " ").split())


def test_a_server_error_exits_5():
    def broken():
        raise ApiError(503, "the database is down")

    with pytest.raises(typer.Exit) as exited:
        call(broken)
    assert exited.value.exit_code == EXIT_SERVICE_ERROR


def test_help_documents_exit_codes_environment_json_and_completion():
    text = " ".join(tessera("--help", COLUMNS="200").stdout.split())
    for phrase in ("Exit codes: 0 ok", "3 not found (404)", "4 service unreachable", "TESSERA_URL", "TESSERA_API_KEY", "--json",
                   "--install-completion"):
        assert phrase in text
    # Where the key comes from, as api.credentials.find_credentials finds it, and an empty variable's meaning.
    assert "else the nearest .tessera/credentials you own in this folder or one above it" in text
    assert "$TESSERA_HOME/credentials if TESSERA_HOME is set" in text and "set but empty counts as unset" in text


def test_shell_completion_completes_commands_and_options():
    commands = tessera(_TESSERA_COMPLETE="complete_bash", COMP_WORDS="tessera ru", COMP_CWORD="1")
    assert commands.exit_code == 0 and commands.stdout.split() == ["runs"]
    options = tessera(_TESSERA_COMPLETE="complete_bash", COMP_WORDS="tessera show --js", COMP_CWORD="2")
    assert options.stdout.split() == ["--json"]


def test_install_completion_hooks_the_script_into_the_users_shell(tmp_path, monkeypatch):
    # typer detects the shell from the process tree (shellingham), which is whatever runs the
    # tests (make's sh, CI's runner): name bash explicitly instead. typer reads this variable
    # when it builds the command, so it must be set before ``invoke``, not in its ``env``.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    installed = tessera("--install-completion", "bash", HOME=str(tmp_path))
    assert installed.exit_code == 0, installed.output
    script = tmp_path / ".bash_completions" / "tessera.sh"
    assert "_TESSERA_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()


def test_importing_the_cli_loads_neither_the_sdk_nor_httpx_nor_pydantic():
    """``tessera --help`` and shell completion stay fast: the SDK is imported when a command runs."""
    code = "import sys, cli.main; print(sorted(m for m in ('httpx', 'api.client', 'pydantic') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_no_help_page_shows_restructuredtext_markup():
    """Docstrings become help text as they are: a command's docstring is written for the terminal."""
    from typer.main import get_command

    def paths(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from paths(sub, [*path, name])

    pages = [tessera(*path, "--help", COLUMNS="200").stdout for path in paths(get_command(app), [])]
    assert len(pages) > 30 and all(isinstance(page, str) and "Usage:" in page for page in pages)
    assert [line.strip() for page in pages for line in page.splitlines() if "``" in line] == []


def test_no_help_text_is_swallowed_as_rich_markup():
    """Typer renders help through rich, which drops ``[word ...]`` as a style tag: an option's
    ``[default: ...]`` vanished from every page. Help text uses parentheses (an escaped ``\\[``
    would reach shell completion's descriptions as it is)."""
    import re

    from typer.main import get_command

    def commands(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from commands(sub, [*path, name])

    tag = re.compile(r"(?<!\\)\[[a-z#/@][^\[]*?\]")  # rich.markup's tag pattern, less its escapes
    found = [(path, text) for path, command in commands(get_command(app), [])
             for text in [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
             if tag.search(text)]
    assert found == []
    page = tessera("show", "--help", COLUMNS="200").stdout
    assert "(default: the URL in .tessera/credentials, else http://127.0.0.1:8000)" in page
