"""``tessera runs`` (and ``tessera sweeps list``) against the real app on a loopback port (no Ray):
a --limit past the API's largest page pages through with its cursor, ``all`` lists every run, a
bad --limit is a usage error; --sweep, --created-after and --created-before reach the API, and an
empty list's hint names them."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from api.client import Client
from api.sweeps import SweepSpec
from cli import output
from cli.main import app
from cli.output import EXIT_USAGE
from tests.dashboard.conftest import LocalService

runner = CliRunner()


def tessera(*args: str):
    return runner.invoke(app, list(args), prog_name="tessera")


def ids(result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [run["id"] for run in json.loads(result.stdout)]


def test_a_limit_past_the_apis_largest_page_pages_through_and_all_lists_every_run(tmp_path, example_spec,
                                                                                 monkeypatch):
    asked: list[int] = []
    list_runs = Client.list_runs

    def counting(self, **query):
        asked.append(query["limit"])
        return list_runs(self, **query)

    monkeypatch.setattr(Client, "list_runs", counting)
    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        for _ in range(7):
            service.repo.create_run(example_spec)
        newest_first = [run.id for run in Client(service.url).list_runs(limit=500).data]
        assert len(newest_first) == 7
        asked.clear()
        # Above the API's page (1-500) the CLI used to send the limit as it was: a 422, exit 1.
        assert ids(tessera("runs", "--limit", "600", "--json", *url)) == newest_first and asked == [500]

        monkeypatch.setattr(output, "LIST_PAGE", 3)  # pages of 3: 7 runs take three
        asked.clear()
        assert ids(tessera("runs", "--limit", "5", "--json", *url)) == newest_first[:5]
        assert asked == [3, 2]  # the second page asks only for what is still wanted
        asked.clear()
        assert ids(tessera("runs", "list", "--limit", "all", "--json", *url)) == newest_first and asked == [3, 3, 3]
        assert tessera("runs", "--limit", "ALL", *url).stdout.count("QUEUED") == 7  # any case; the table too
        asked.clear()
        assert ids(tessera("runs", "--json", *url)) == newest_first and asked == [3, 3, 3]  # the default, 20
        assert json.loads(tessera("sweeps", "list", "--limit", "600", "--json", *url).stdout) == []


@pytest.mark.parametrize("args", [["runs", "--limit", "-1"], ["runs", "--limit=0"], ["runs", "list", "--limit", "many"],
                                  ["sweeps", "list", "--limit", "-5"]])
def test_a_limit_below_1_or_no_number_is_a_usage_error_that_names_it_and_what_is_allowed(args):
    refused = tessera(*args, "--url", "http://127.0.0.1:9")  # refused before anything is sent
    assert refused.exit_code == EXIT_USAGE, refused.output
    said = " ".join(refused.output.replace("│", " ").split())
    value = args[-1].removeprefix("--limit=")
    assert f"Invalid value for '--limit': '{value}': give a whole number of at least 1, or all" in said, said


def test_runs_filters_by_sweep_and_creation_time_and_an_empty_list_names_them(tmp_path, example_spec, example_body):
    from service.db.models import Run

    with LocalService(tmp_path) as service:
        url = ["--url", service.url]
        old, new = service.repo.create_run(example_spec), service.repo.create_run(example_spec)
        with service.repo.db.write() as session:
            session.get(Run, old.id).created_at = datetime(2020, 1, 1, tzinfo=timezone.utc)
        sweeps = service.app.state.sweeps
        sweep = sweeps.create_sweep(SweepSpec.model_validate({"name": "s", "base": example_body,
                                                              "search": {"algorithms": {"sets": [[]]}}}),
                                    driver="external", token="driver")
        trial = sweeps.register_trial(sweep.id, trial_id="t1", spec=example_spec, params={}, token="t1")

        assert ids(tessera("runs", "--sweep", sweep.id, "--json", *url)) == [trial.id]
        assert ids(tessera("runs", "--created-before", "2021-01-01", "--json", *url)) == [old.id]
        assert set(ids(tessera("runs", "--created-after", "2021-01-01T00:00+00:00", "--json", *url))) == {new.id,
                                                                                                         trial.id}
        # No offset: UTC, as the service reads it; both bounds together
        assert ids(tessera("runs", "--created-after", "2019-12-31T23:00", "--created-before", "2020-01-01T01:00Z",
                           "--json", *url)) == [old.id]

        empty = tessera("runs", "--sweep", "nosuchsweep", "--created-after", "2030-01-01", "--created-before",
                        "2031-01-01T12:00+02:00", *url)
        assert empty.exit_code == 0 and "┃id" in empty.stdout
        assert " ".join(empty.stderr.split()) == (
            "no runs match --sweep nosuchsweep --created-after 2030-01-01T00:00:00 --created-before "
            "2031-01-01T12:00:00+02:00; archived runs are hidden (--archived all lists them too)")

        for option in ("--created-after", "--created-before"):
            refused = tessera("runs", option, "yesterday", *url)
            said = " ".join(refused.output.replace("│", " ").split())
            assert refused.exit_code == EXIT_USAGE and f"Invalid value for '{option}': 'yesterday' is not an ISO " \
                "8601 date or time" in said, said
