"""``Client.iter_metrics`` (every point, paged by seq, optionally one key's) and
``Client.add_tags``/``remove_tags`` (the edit rules of ``tessera tag RUN +a -b``), against the
app on SQLite through a TestClient-backed transport."""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
import pytest

from api.client import Client
from api.errors import ApiError, InvalidInput
from api.views import ReportedMetric, RunStatus

API = "/api/v1"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def sent(client) -> list[httpx.Request]:
    """Every request the ``sdk`` fixture sends, in order."""
    return []


@pytest.fixture
def sdk(client, sent):
    """The SDK over ``client``'s app (the admin key), recording what it sends in ``sent``."""

    class ThroughTestClient(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            answer = client.request(request.method, str(request.url), headers=dict(request.headers),
                                    content=request.read())
            return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    with Client("http://testserver", transport=ThroughTestClient()) as sdk:
        yield sdk


@pytest.fixture
def run_id(client, example_body) -> str:
    """A RUNNING run (no Ray: it stays where the test puts it)."""
    made = client.post(f"{API}/runs", json=example_body)
    assert made.status_code == 201, made.text
    repo = client.app.state.repo
    run_id = made.json()["id"]
    repo.begin_attempt(run_id, token="test-token")
    repo.transition(run_id, RunStatus.RUNNING)
    return run_id


def _metric_requests(sent: list[httpx.Request]) -> list[dict[str, str]]:
    return [dict(r.url.params) for r in sent if r.url.path.endswith("/metrics")]


def test_iter_metrics_pages_through_every_point_oldest_first_and_filters_by_key(client, sdk, sent, run_id):
    repo = client.app.state.repo
    repo.add_metrics(run_id, [ReportedMetric(step=s, key="train/loss", value=2.0 / s, time=NOW) for s in range(1, 6)])
    repo.add_metrics(run_id, [ReportedMetric(step=s, key="eval/accuracy", value=s / 10, time=NOW) for s in (2, 4)])

    points = list(sdk.iter_metrics(run_id, page_size=3))  # seven points: pages of 3, 3 and 1
    assert [(p.key, p.step) for p in points] == [("train/loss", s) for s in range(1, 6)] + [
        ("eval/accuracy", 2), ("eval/accuracy", 4)]
    seqs = [p.seq for p in points]
    assert seqs == sorted(seqs) and len(set(seqs)) == 7
    pages = _metric_requests(sent)
    assert [(q["after"], q["limit"]) for q in pages] == [("0", "3"), (str(seqs[2]), "3"), (str(seqs[5]), "3")]

    sent.clear()
    only = list(sdk.iter_metrics(run_id, key="eval/accuracy", page_size=3))
    assert [(p.step, p.value) for p in only] == [(2, 0.2), (4, 0.4)]
    assert _metric_requests(sent) == [{"after": "0", "limit": "3", "key": "eval/accuracy"}]  # filtered by the service
    assert list(sdk.iter_metrics(run_id, key="eval/nope")) == []
    assert [p.seq for p in sdk.iter_metrics(run_id)] == seqs  # the default page holds them all


def test_iter_metrics_is_lazy_and_an_exact_page_ends_with_an_empty_one(client, sdk, sent, run_id):
    client.app.state.repo.add_metrics(run_id, [ReportedMetric(step=s, key="loss", value=1.0, time=NOW)
                                               for s in range(4)])
    points = sdk.iter_metrics(run_id, page_size=2)
    assert sent == []  # a generator: nothing is fetched before the first point is asked for
    assert next(points).step == 0 and len(_metric_requests(sent)) == 1
    assert [p.step for p in points] == [1, 2, 3]
    assert len(_metric_requests(sent)) == 3  # two full pages, then an empty one says it is over


def test_iter_metrics_of_an_unknown_run_is_a_404(sdk):
    with pytest.raises(ApiError) as raised:
        next(sdk.iter_metrics("doesnotexist"))
    assert raised.value.status_code == 404


def test_add_and_remove_tags_edit_the_list_as_tessera_tag_does(sdk, sent, run_id):
    assert sdk.add_tags(run_id, "baseline", "draft").tags == ["baseline", "draft"]
    assert sdk.add_tags(run_id, "draft", "lr-sweep").tags == ["baseline", "draft", "lr-sweep"]  # kept in place
    assert sdk.remove_tags(run_id, "draft", "never-had-it").tags == ["baseline", "lr-sweep"]
    assert sdk.get_run(run_id).tags == ["baseline", "lr-sweep"]
    assert sdk.remove_tags(run_id).tags == ["baseline", "lr-sweep"]  # no tags: no change

    sent.clear()
    for bad in ("has space", "", "+plus"):
        with pytest.raises(InvalidInput) as raised:
            sdk.add_tags(run_id, bad)
        assert raised.value.detail[0]["field"].startswith("tags")  # "tags[2]" names the bad one
    with pytest.raises(InvalidInput):
        sdk.remove_tags(run_id, "")
    assert [r.method for r in sent] == ["GET"] * 4  # refused before anything was written
    assert sdk.get_run(run_id).tags == ["baseline", "lr-sweep"]


def test_tags_of_an_unknown_run_are_a_404(sdk):
    for edit in (sdk.add_tags, sdk.remove_tags):
        with pytest.raises(ApiError) as raised:
            edit("doesnotexist", "a")
        assert raised.value.status_code == 404
