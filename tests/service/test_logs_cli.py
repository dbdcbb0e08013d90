"""``tessera logs -f`` (and ``tessera sweeps logs``): prints the log once, following by byte
offset until the attempt ends."""

from __future__ import annotations

import httpx

from api.client import Client
from cli.logs import print_logs, read_log, run_pages, sweep_pages


def test_follow_prints_every_byte_once_and_stops_when_the_attempt_ends(capsys):
    # The service's answers over time: the log grows, then the run ends.
    log = ["a\n", "a\nb\n", "a\nb\nc\n"]
    calls = []

    def service(request: httpx.Request) -> httpx.Response:
        after = int(request.url.params["after"])
        calls.append(after)
        text = log[min(len(calls) - 1, len(log) - 1)].encode()
        live = len(calls) < len(log)
        chunk = text[after:]
        return httpx.Response(200, json={"run_id": "r", "attempt": 1, "attempts": 1, "text": chunk.decode(),
                                         "offset": after, "next_offset": after + len(chunk), "size": len(text),
                                         "live": live, "source": "ray"})

    with Client("http://tessera.test", transport=httpx.MockTransport(service)) as client:
        print_logs(run_pages(client, "r"), attempt=None, follow=True, poll_interval=0)
    assert capsys.readouterr().out == "a\nb\nc\n"
    assert calls == [0, 2, 4]


def test_follow_goes_on_to_the_next_attempt_until_the_run_ends(capsys):
    # Attempt 1 ends (its worker group restarts), attempt 2 writes and the run ends.
    logs = {1: b"one\n", 2: b"two\n"}
    newest = iter([1])  # the run's attempt when the first request, which names none, arrives
    requested = []

    def service(request: httpx.Request) -> httpx.Response:
        attempt = int(request.url.params.get("attempt") or next(newest))
        after = int(request.url.params["after"])
        requested.append((attempt, after))
        text = logs[attempt]
        return httpx.Response(200, json={"run_id": "r", "attempt": attempt, "attempts": 2,
                                         "text": text[after:].decode(), "offset": after, "next_offset": len(text),
                                         "size": len(text), "live": attempt == 2 and after == 0, "source": "storage"})

    with Client("http://tessera.test", transport=httpx.MockTransport(service)) as client:
        print_logs(run_pages(client, "r"), attempt=None, follow=True, poll_interval=0)
    out = capsys.readouterr()
    assert out.out == "one\ntwo\n" and out.err == "--- attempt 2 ---\n"
    assert requested == [(1, 0), (2, 0), (2, 4)]


def test_follow_of_a_named_attempt_stops_when_it_ends(capsys):
    def service(request: httpx.Request) -> httpx.Response:
        assert request.url.params["attempt"] == "1"
        return httpx.Response(200, json={"run_id": "r", "attempt": 1, "attempts": 2, "text": "one\n",
                                         "offset": 0, "next_offset": 4, "size": 4, "live": False, "source": "storage"})

    with Client("http://tessera.test", transport=httpx.MockTransport(service)) as client:
        print_logs(run_pages(client, "r"), attempt=1, follow=True, poll_interval=0)
    assert capsys.readouterr().out == "one\n"


def test_the_json_form_reads_every_page_of_the_log_so_far():
    text = b"line one\nline two\nline three\n"

    paths = []

    def service(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        after = int(request.url.params["after"])
        chunk = text[after:after + 10]  # the service answers in pages of 10 bytes
        return httpx.Response(200, json={"run_id": "r", "sweep_id": "s", "attempt": 2, "attempts": 2,
                                         "text": chunk.decode(), "offset": after, "next_offset": after + len(chunk),
                                         "size": len(text), "live": True, "source": "ray"})

    with Client("http://tessera.test", transport=httpx.MockTransport(service)) as client:
        page = read_log(run_pages(client, "r"), attempt=None)
        sweep_page = read_log(sweep_pages(client, "s"), attempt=None)
    assert (page.text, page.offset, page.next_offset, page.attempt) == (text.decode(), 0, len(text), 2)
    assert (sweep_page.sweep_id, sweep_page.text) == ("s", text.decode())
    assert set(paths) == {"/api/v1/runs/r/logs", "/api/v1/sweeps/s/logs"}


def test_colour_codes_go_when_the_log_is_written_to_a_file_or_pipe_and_stay_on_a_terminal(capsys, monkeypatch):
    coloured = "\x1b[36m(RayTrainWorker pid=7)\x1b[0m epoch 1\n\x1b[1m\x1b[32mhttp://127.0.0.1:8265 \x1b[39m\x1b[22m\n"

    def service(request: httpx.Request) -> httpx.Response:
        size = len(coloured.encode())
        return httpx.Response(200, json={"run_id": "r", "attempt": 1, "attempts": 1, "text": coloured, "offset": 0,
                                         "next_offset": size, "size": size, "live": False, "source": "storage"})

    with Client("http://tessera.test", transport=httpx.MockTransport(service)) as client:
        print_logs(run_pages(client, "r"), attempt=None, follow=False)  # capsys: not a terminal
        assert capsys.readouterr().out == "(RayTrainWorker pid=7) epoch 1\nhttp://127.0.0.1:8265 \n"
        monkeypatch.setattr("sys.stdout.isatty", lambda: True)
        print_logs(run_pages(client, "r"), attempt=None, follow=False)
        assert capsys.readouterr().out == coloured
