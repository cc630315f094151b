"""The retrieval service beside idle, trickling, partial, heavy and non-reading clients, on loopback, bounded.

    .venv/bin/python bench/bench_service_load.py --seconds 20

Starts `maps-train retrieve serve` (its default limits: header timeout 5 s, body read timeout 10 s, send timeout
30 s, 512 connections; BM25 over ../shared/realdata's corpus, built once under $MAPS_TRAIN_HOME) as a child
process, then runs each scenario below for `--seconds` while `--good` clients send one-query requests (k=5, a
HotpotQA dev question each, a new connection per request, as a new agent would) back to back:
- `alone`: nothing else;
- `idle headers`: `--idle` connections that send part of a request line and headers, then nothing (each reopened
  as soon as the service closes it);
- `trickling headers`: `--idle` connections that send one byte of header every 5 s (reopened when closed);
- `partial bodies`: `--idle` connections that send whole headers and 17 bytes of a 500-byte body, then nothing;
- `heavy`: two clients looping legal 300-query x k=20 requests (HotpotQA dev questions), read at full speed;
- `non-readers`: `--nonreaders` clients that each send a legal 2,048-query x k=16 request (32,768 hits) and never
  read the answer.
For each: good requests answered, their p50/p99 latency, failures by kind (503s named), heavy responses read
whole, and the service's resident memory (main and worker process together, sampled every 0.2 s) at the start
and its peak. Stops by itself; nothing is asserted. Figures: docs/retrieval-service.md.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared/realdata/corpus/corpus.jsonl"
QUESTIONS = REPO.parent / "shared/realdata/hotpotqa/dev.jsonl"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(port: int, log: Path, extra: list[str]) -> subprocess.Popen:
    index = Path(os.environ.get("MAPS_TRAIN_HOME", REPO / ".cache/maps-train")) / "bench-service-bm25"
    if not (index / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "maps_train.cli", "index", "build", "--corpus", str(CORPUS), "--kind",
                        "bm25", "--out", str(index)], cwd=REPO, check=True, capture_output=True)
    return subprocess.Popen(
        [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(index), "--port", str(port),
         *extra], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)


def rss(process: psutil.Process) -> int:
    """Resident memory of the service: granian's main process and its worker."""
    total = 0
    for proc in [process, *process.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


async def good_client(url: str, until: float, questions, latencies: list[float], failures: list[str]) -> None:
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection per request: it must be accepted
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        while time.monotonic() < until:
            start = time.perf_counter()
            try:
                response = await client.post(f"{url}/search", json={"queries": [next(questions)], "k": 5})
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures.append(f"HTTP {response.status_code}")
            except httpx.HTTPError as err:
                failures.append(type(err).__name__)


async def stalled_client(port: int, until: float, opened: list[int], first: bytes, trickle: bytes = b"") -> None:
    """Sends `first`, then one byte of `trickle` every 5 s (or nothing); reopens once the service closes it."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        opened.append(1)
        try:
            writer.write(first)
            await writer.drain()
            for byte in itertools.cycle(trickle) if trickle else iter(()):
                try:
                    if not await asyncio.wait_for(reader.read(4096), 5):
                        break  # closed by the service
                    continue
                except TimeoutError:
                    writer.write(bytes([byte]))
                    await writer.drain()
                if time.monotonic() >= until:
                    break
            else:
                await asyncio.wait_for(reader.read(), max(0.1, until - time.monotonic()))
        except (TimeoutError, OSError):
            pass
        writer.close()


def request_bytes(queries: list[str], k: int) -> bytes:
    body = json.dumps({"queries": queries, "k": k}).encode()
    return (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


async def heavy_client(port: int, until: float, request: bytes, done: list[int], read: bool = True) -> None:
    """Sends `request` and reads the answer whole, in a loop; or (`read=False`) sends it once and never reads."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            if not read:
                await asyncio.sleep(max(0.0, until - time.monotonic()))
                writer.close()
                return
            received = b""
            while chunk := await asyncio.wait_for(reader.read(1 << 20), max(0.1, until - time.monotonic())):
                received += chunk
            if received.endswith(b"0\r\n\r\n") or received.endswith(b"]}"):
                done.append(len(received))
            writer.close()
        except (TimeoutError, OSError):
            pass


async def scenario(name: str, args, port: int, service: psutil.Process, questions) -> dict:
    url = f"http://127.0.0.1:{port}"
    until = time.monotonic() + args.seconds
    latencies, failures, opened, heavy_done, peak = [], [], [], [], [0]
    start_rss = rss(service)

    async def sample_memory():
        while time.monotonic() < until:
            peak[0] = max(peak[0], rss(service))
            await asyncio.sleep(0.2)

    tasks = [sample_memory()]
    tasks += [good_client(url, until, questions, latencies, failures) for _ in range(args.good)]
    partial_header = b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: appl"
    if name == "idle headers":
        tasks += [stalled_client(port, until, opened, partial_header) for _ in range(args.idle)]
    elif name == "trickling headers":
        tasks += [stalled_client(port, until, opened, b"P", b"OST /search HTTP/1.1\r\nX: " + b"a" * 64)
                  for _ in range(args.idle)]
    elif name == "partial bodies":
        head = b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
        tasks += [stalled_client(port, until, opened, head + b'{"queries": ["stall') for _ in range(args.idle)]
    elif name == "heavy":
        request = request_bytes([next(questions) for _ in range(300)], 20)
        tasks += [heavy_client(port, until, request, heavy_done) for _ in range(2)]
    elif name == "non-readers":
        request = request_bytes([next(questions) for _ in range(2048)], 16)
        tasks += [heavy_client(port, until, request, heavy_done, read=False) for _ in range(args.nonreaders)]
    await asyncio.gather(*tasks)
    await asyncio.sleep(1)  # let the service close what the clients left
    latencies.sort()
    return {
        "scenario": name,
        "good answered": len(latencies),
        "p50 ms": round(statistics.median(latencies) * 1000) if latencies else None,
        "p99 ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000) if latencies else None,
        "failed": {kind: failures.count(kind) for kind in sorted(set(failures))},
        "stalled connections opened": len(opened),
        "heavy answers read whole": len(heavy_done),
        "rss MB start -> peak": f"{start_rss / 1e6:.0f} -> {peak[0] / 1e6:.0f}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20, help="Length of each scenario")
    parser.add_argument("--good", type=int, default=2, help="Clients sending one-query requests back to back")
    parser.add_argument("--idle", type=int, default=520, help="Idle, trickling or partial connections")
    parser.add_argument("--nonreaders", type=int, default=40)
    parser.add_argument("--scenarios", default="alone,idle headers,trickling headers,partial bodies,heavy,non-readers")
    parser.add_argument("serve_args", nargs="*", help="Extra `retrieve serve` options (after --)")
    args = parser.parse_args()
    port, log = free_port(), Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-service-{os.getpid()}.log"
    questions = itertools.cycle([json.loads(line)["question"] for line in QUESTIONS.open(encoding="utf-8")])
    proc = start_service(port, log, args.serve_args)
    results = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"the service did not start; see {log}") from None
                time.sleep(0.5)
        service = psutil.Process(proc.pid)
        for name in args.scenarios.split(","):
            results.append(asyncio.run(scenario(name, args, port, service, questions)))
            print(json.dumps(results[-1]), flush=True)
        stats = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["stats"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    print(f"{args.seconds:.0f} s a scenario on loopback, {args.good} good clients (machine: {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}); service stats: {json.dumps(stats)}; tracebacks logged: "
          f"{text.count('Traceback')}; log: {log}")
    print("| scenario | good answered | p50 / p99 | failed | stalled opened | heavy read whole | RSS MB start -> peak |")
    print("|---|---:|---|---|---:|---:|---|")
    for row in results:
        print(f"| {row['scenario']} | {row['good answered']} | {row['p50 ms']} / {row['p99 ms']} ms | "
              f"{row['failed'] or 'none'} | {row['stalled connections opened']} | {row['heavy answers read whole']} | "
              f"{row['rss MB start -> peak']} |")


if __name__ == "__main__":
    main()
