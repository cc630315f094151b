"""Retries against a loopback HTTP server that answers as scripted: the openai SDK retries the OpenAI backend's
calls itself (backoff, Retry-After, the final error as one line), the retrieval client retries 5xx by hand.

The server is a stand-in only for what a real vLLM or retrieval service cannot be made to do on cue: answer 503."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.router import build_router
from maps_train.recipe import BackendConfig, Recipe, RoleRoute
from maps_train.retrieval.client import RetrievalClient

CHAT_REPLY = {  # the fields the SDK's ChatCompletion model requires
    "id": "cmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "writer",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
SEARCH_REPLY = {"hits": [[{"id": "d1", "title": "T", "text": "x", "score": 1.0}]]}
BUSY = (503, {}, {"detail": "busy"})


class ScriptedServer:
    """Answers the n-th request with `replies[n]` (the last one repeats) and records each request it saw."""

    def __init__(self, replies: list[tuple[int, dict, dict]]):
        self.replies = replies
        self.seen: list[dict] = []  # path, SDK retry counter and arrival time of every request, in order
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.seen.append(
                    {"path": self.path, "retry": self.headers.get("x-stainless-retry-count"), "at": time.monotonic()}
                )
                status, headers, body = server.replies[min(len(server.seen), len(server.replies)) - 1]
                payload = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):  # quiet test output
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)  # quick shutdown

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def waited_s(self) -> float:
        """Seconds from the first request to the last: the client's backoff, whatever ran before its first call."""
        return self.seen[-1]["at"] - self.seen[0]["at"]

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def ask_writer(url: str, max_retries: int) -> str:
    """One chat call through the router, as the agent makes it; the text it returned."""
    recipe = Recipe(
        # truncate_prompt=left: the server would cut a long prompt, so no tokenizer is loaded here (seconds saved)
        backend=BackendConfig(
            base_urls=[f"{url}/v1"], max_retries=max_retries, request_timeout_s=5, truncate_prompt="left"
        ),
        roles={"default": RoleRoute(backend="openai", adapter="writer")},
    )
    router = build_router(recipe)
    try:
        [completion] = router.generate([ChatRequest(role="writer", messages=[{"role": "user", "content": "hi"}])])
        return completion.text
    finally:
        router.close()


def test_sdk_retries_a_busy_server_with_its_own_backoff_then_succeeds():
    with ScriptedServer([BUSY, BUSY, (200, {}, CHAT_REPLY)]) as server:
        assert ask_writer(server.url, max_retries=2) == "hello"
    assert [seen["retry"] for seen in server.seen] == ["0", "1", "2"]  # three attempts, counted by the SDK
    assert {seen["path"] for seen in server.seen} == {"/v1/chat/completions"}
    # the SDK's backoff: 0.5 s then 1 s, each less up to 25 % jitter (at least 1.125 s in all)
    assert 1.1 <= server.waited_s() < 2.0


def test_sdk_gives_up_after_max_retries_in_one_line_honouring_retry_after():
    busy_briefly = (503, {"retry-after-ms": "10"}, {"detail": "busy"})  # the server asks for a 10 ms wait
    with ScriptedServer([busy_briefly]) as server:
        with pytest.raises(MapsTrainError, match=r"backend.base_urls: \S+ failed 3 times \(InternalServerError") as err:
            ask_writer(server.url, max_retries=2)
    assert "\n" not in str(err.value) and "on role 'writer' (model=writer)" in str(err.value)
    assert len(server.seen) == 3
    assert server.waited_s() < 0.5  # Retry-After, not the 1.5 s of the SDK's own backoff


def test_a_refusal_is_not_retried():
    with ScriptedServer([(400, {}, {"error": {"message": "bad request: max_tokens"}})]) as server:
        with pytest.raises(MapsTrainError, match=r"refused role 'writer' \(model=writer\) \(HTTP 400: .*max_tokens"):
            ask_writer(server.url, max_retries=2)
    assert len(server.seen) == 1


def test_retrieval_client_retries_a_busy_service_then_succeeds():
    with ScriptedServer([BUSY, BUSY, (200, {}, SEARCH_REPLY)]) as server:
        hits = RetrievalClient(server.url, retries=2).search(["who"], 1)
    assert [hit.id for hit in hits[0]] == ["d1"]
    assert [seen["path"] for seen in server.seen] == ["/search"] * 3
    assert 1.4 <= server.waited_s() < 2.0  # 0.5 s, then 1 s


def test_retrieval_client_gives_up_after_its_retries_in_one_line():
    with ScriptedServer([BUSY]) as server:
        with pytest.raises(MapsTrainError, match=r"retrieval service \S+/search: HTTP 503: busy$"):
            RetrievalClient(server.url, retries=1).search(["who"], 1)
    assert len(server.seen) == 2
