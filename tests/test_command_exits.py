"""A command that failed exits: `maps-train run` over the openai backend, against a server where nothing listens and
against one that refuses one call and holds every other one open, prints its one error line and its process ends
within a bound (question threads and the backend's loop do not keep it alive). Real CLI processes, BM25 over the
demo corpus, a loopback HTTP server that never answers."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from maps_train.platform import free_port

REPO = Path(__file__).resolve().parent.parent
EXIT_BOUND_S = 60  # after the error: closing the backend and the coalescers waits at most 10 s each


class StallingServer:
    """An OpenAI-compatible URL that answers the first POST with a 400 (a refusal the SDK does not retry) and holds
    every later request open, unanswered, until the test ends."""

    def __init__(self):
        self.release = threading.Event()
        self.refused = threading.Event()
        self.held = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not server.refused.is_set():
                    server.refused.set()
                    body = b'{"error": {"message": "no", "type": "BadRequestError", "code": 400}}'
                    self.send_response(400)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                server.held += 1
                server.release.wait(300)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def write_recipe(tmp_path: Path, url: str, **backend) -> Path:
    raw = {
        "retrieval": {"corpus": str(REPO / "data/demo/corpus.jsonl"), "kind": "bm25",
                      "index_dir": str(tmp_path / "index")},
        "backend": {"base_urls": [url], **backend},
        "roles": {"default": {"backend": "openai", "adapter": "teacher", "max_tokens": 32}},
        "agent": {"schedule": "continuous", "concurrency": 4, "num_directions": 2, "max_rounds": 2},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def start_run(tmp_path: Path, recipe: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, "-m", "maps_train.cli", "run", str(recipe), "--questions", str(REPO / "data/demo/test.jsonl"),
         "--out", str(tmp_path / "out"), "--limit", "12", "--no-progress"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"maps-train run still alive {timeout:.0f}s on; it printed:\n{err[-3000:]}") from None
    return proc.returncode, err


def test_a_run_against_an_unreachable_backend_exits_after_its_error_line(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    proc = start_run(tmp_path, write_recipe(tmp_path, url, max_retries=1, request_timeout_s=2))
    code, err = finish(proc, timeout=120 + EXIT_BOUND_S)  # an index build, two attempts per call, then the exit
    assert code == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert lines[-1].startswith("maps-train: error: backend.base_urls: ") and "failed 2 times" in lines[-1], err[-3000:]
    assert "Traceback" not in err


def test_a_run_whose_other_calls_stall_exits_once_one_call_failed(tmp_path):
    server = StallingServer()
    try:
        # the SDK would wait 600 s on each held call: the command must not wait for them once it has failed
        proc = start_run(tmp_path, write_recipe(tmp_path, server.url, max_retries=0, request_timeout_s=600))
        for _ in range(180):  # the index is built first; a run that died before calling is told below
            if server.refused.wait(1) or proc.poll() is not None:
                break
        assert server.refused.is_set(), f"the run never called its backend: {finish(proc, 10)}"
        code, err = finish(proc, timeout=EXIT_BOUND_S)
        assert server.held >= 1  # other questions' calls were in flight, held, when the refusal ended the run
        assert code == 2, err[-3000:]
        assert err.strip().splitlines()[-1].startswith("maps-train: error: backend.base_urls: "), err[-3000:]
        assert "refused" in err and "HTTP 400" in err and "Traceback" not in err
    finally:
        server.close()
