"""Issue 65 (parts 4, 5): no idle, trickling or non-reading client holds the retrieval service.

The real `maps-train retrieve serve` process (granian) over a real BM25 index of ../shared/realdata's first passages,
on loopback, with short timeouts set by its options; raw sockets for the clients no real client would be. Every
wait is a bounded loop on what the service does (a socket closed, a counter in /health), never a timed assertion.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from maps_train.errors import MapsTrainError
from maps_train.platform import free_port
from maps_train.serve.server import wait_until_healthy

REPO = Path(__file__).resolve().parent.parent
OPTIONS = ["--header-timeout-s", "1", "--read-timeout-s", "1", "--send-timeout-s", "2"]


@pytest.fixture(scope="module")
def service(short_corpus, tmp_path_factory):
    """(url, port) of `maps-train retrieve serve` with the default limits but short timeouts (OPTIONS)."""
    from maps_train.retrieval.bm25 import build_bm25_index

    index = build_bm25_index(short_corpus, tmp_path_factory.mktemp("bm25") / "index", show_progress=False)
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "serve.log"
    command = [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(index), "--port", str(port)]
    with log.open("w") as sink:
        process = subprocess.Popen(command + OPTIONS, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:  # until it answers, at most a minute
            wait_until_healthy(process, f"{url}/health", 60, lambda code: f"the service exited {code}")
        except MapsTrainError as err:
            pytest.fail(f"the service did not start ({err}): {log.read_text()}")
        yield url, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stats(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=30).json()["stats"]


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    """Whether the server closes `sock` within `wait_s` (whatever it sends first is read and dropped)."""
    sock.settimeout(wait_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def good_request(url: str) -> httpx.Response:
    return httpx.post(f"{url}/search", json={"queries": ["river flowing through a valley"], "k": 3}, timeout=60)


def test_idle_header_connections_are_closed_and_good_requests_answered(service):
    """520 connections that send part of a request line and headers (or nothing) and stop: more than the 512
    slots of --max-connections. Good requests are still answered 200 (none 503), and every idle one is closed."""
    url, port = service
    idle = []
    try:
        for i in range(520):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            if i % 2:
                sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
            idle.append(sock)
        answers = [good_request(url) for _ in range(3)]
        assert [answer.status_code for answer in answers] == [200] * 3, [answer.text[:200] for answer in answers]
        assert all(len(answer.json()["hits"]) == 1 for answer in answers)
        assert all(closed_by_server(sock, 30) for sock in idle)
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_trickling_its_headers_is_dropped(service):
    """A byte of header every 0.25 s, never ending it: the connection is closed before the header is done."""
    url, port = service
    header = b"POST /search HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        while sent < len(header):
            try:
                sock.sendall(header[sent : sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            readable, _, _ = select.select([sock], [], [], 0.25)  # the pace, and a look for the server's close
            if readable and closed_by_server(sock, 5):
                break
        assert sent < len(header)  # dropped mid-header
    assert good_request(url).status_code == 200


def test_a_stalled_body_gets_408_under_granian(service):
    url, port = service
    dropped = stats(url)["dropped"]
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
            b'{"queries": ["who'
        )
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408 ") and b"(--read-timeout-s)" in reply
    assert stats(url)["dropped"] == dropped + 1


def test_a_client_that_does_not_read_stops_its_search_and_is_cut_off(service):
    """A legal 2048-query x k16 request (32,768 hits, about 9 MB of JSON here) whose client never reads: the
    service searches only the slices it can hand over, answers a one-query request meanwhile, cuts the
    non-reader off after --send-timeout-s, and never searched the heavy request whole."""
    url, port = service
    before = stats(url)
    body = json.dumps(
        {"queries": [f"the american band album film born known for his {i} song" for i in range(2048)], "k": 16}
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    try:
        sock.sendall(
            b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert good_request(url).status_code == 200
        for _ in range(600):  # until the service cuts it off, at most about a minute
            if stats(url)["unread"] > before["unread"]:
                break
            time.sleep(0.1)
        after = stats(url)
        assert after["unread"] == before["unread"] + 1
        reply = b""
        while chunk := sock.recv(1 << 20):
            reply += chunk
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 200 ") and not reply.endswith(b"0\r\n\r\n")  # a cut chunked body
    assert after["queries"] - before["queries"] < 2048  # the unread request was never searched whole


def test_a_torn_index_is_one_line_and_exit_2(short_corpus, tmp_path):
    """The index loads in granian's worker: a file missing there is still one line and exit 2, not a traceback."""
    from maps_train.retrieval.bm25 import build_bm25_index

    index = build_bm25_index(short_corpus, tmp_path / "index", show_progress=False)
    next(path for path in index.rglob("params.index.json")).unlink()
    command = [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(index)]
    done = subprocess.run(command + ["--port", str(free_port())], cwd=REPO, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert f"retrieve serve: cannot load {index}: FileNotFoundError" in output and "Traceback" not in output
