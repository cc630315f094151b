"""The retrieval service under slow, partial and heavy clients, on loopback, for a bounded time.

    .venv/bin/python bench/bench_service_load.py --seconds 20 --partial 200 --slow 20 --heavy 4 --good 4

Starts `maps-train retrieve serve` (BM25 over ../shared/realdata's corpus, built once under $MAPS_TRAIN_HOME) as a
child process with `--read-timeout-s 5`, then for `--seconds`:
- `--good` clients send one-query requests (k=5) back to back: how many are answered, and their latency;
- `--partial` clients each open a connection, send the headers and part of the body, and stall (the service must
  drop them after its read timeout, one log line each); each is replaced when dropped;
- `--slow` clients send a legal 2048-query, k=16 request (32,768 hits) and read the answer at 64 KiB/s;
- `--heavy` clients send that request back to back and read at full speed.
Prints good requests answered and their p50/p95/max latency, the service's peak resident memory (sampled every
0.2 s), the drops it counted (/health `stats.dropped`) against its "dropped /search" log lines, and whether any
traceback was logged. Nothing is asserted. Figures are in docs/throughput.md.
"""

from __future__ import annotations

import argparse
import asyncio
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
HEAVY_BODY = json.dumps({"queries": [f"heavy query number {i} about a river" for i in range(2048)], "k": 16}).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(port: int, log: Path) -> subprocess.Popen:
    index = Path(os.environ.get("MAPS_TRAIN_HOME", REPO / ".cache/maps-train")) / "bench-service-bm25"
    if not (index / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "maps_train.cli", "index", "build", "--corpus", str(CORPUS), "--kind",
                        "bm25", "--out", str(index)], cwd=REPO, check=True, capture_output=True)
    return subprocess.Popen(
        [sys.executable, "-m", "maps_train.cli", "retrieve", "serve", "--index", str(index), "--port", str(port),
         "--read-timeout-s", "5"], cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)


async def good_client(url: str, until: float, latencies: list[float], failures: list[str]) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        while time.monotonic() < until:
            start = time.perf_counter()
            try:
                response = await client.post(f"{url}/search", json={"queries": ["who founded the company"], "k": 5})
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                else:
                    failures.append(str(response.status_code))
            except httpx.HTTPError as err:
                failures.append(type(err).__name__)


async def partial_client(port: int, until: float, opened: list[int]) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        opened.append(1)
        writer.write(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                     b'{"queries": ["stall')
        await writer.drain()
        try:
            await asyncio.wait_for(reader.read(), max(0.1, until - time.monotonic()))  # until the service drops it
        except (TimeoutError, OSError):
            pass
        writer.close()


async def heavy_client(port: int, until: float, read_rate: float | None, done: list[int]) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                         + f"Content-Length: {len(HEAVY_BODY)}\r\n\r\n".encode() + HEAVY_BODY)
            await writer.drain()
            received = 0
            while time.monotonic() < until:
                chunk = await asyncio.wait_for(reader.read(65536), max(0.1, until - time.monotonic()))
                if not chunk:
                    done.append(received)
                    break
                received += len(chunk)
                if read_rate:
                    await asyncio.sleep(len(chunk) / read_rate)
            writer.close()
        except (TimeoutError, OSError):
            pass


async def load(args, port: int, service: psutil.Process) -> dict:
    url = f"http://127.0.0.1:{port}"
    until = time.monotonic() + args.seconds
    latencies, failures, opened, slow_done, heavy_done, peak = [], [], [], [], [], [0]

    async def sample_memory():
        while time.monotonic() < until:
            peak[0] = max(peak[0], service.memory_info().rss)
            await asyncio.sleep(0.2)

    tasks = [sample_memory()]
    tasks += [good_client(url, until, latencies, failures) for _ in range(args.good)]
    tasks += [partial_client(port, until, opened) for _ in range(args.partial)]
    tasks += [heavy_client(port, until, 64 * 1024, slow_done) for _ in range(args.slow)]
    tasks += [heavy_client(port, until, None, heavy_done) for _ in range(args.heavy)]
    await asyncio.gather(*tasks)
    async with httpx.AsyncClient(timeout=30) as client:
        stats = (await client.get(f"{url}/health")).json()["stats"]
    return {"latencies": latencies, "failures": failures, "partial_opened": len(opened), "slow_done": slow_done,
            "heavy_done": heavy_done, "peak_rss": peak[0], "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--good", type=int, default=4)
    parser.add_argument("--partial", type=int, default=200)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--heavy", type=int, default=4)
    args = parser.parse_args()
    port, log = free_port(), Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-service-{os.getpid()}.log"
    proc = start_service(port, log)
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
        idle_rss = service.memory_info().rss
        result = asyncio.run(load(args, port, service))
    finally:
        proc.terminate()  # uvicorn waits for connections still open at shutdown: not for long here
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    latencies = sorted(result["latencies"])
    print(f"{args.seconds:.0f} s on loopback: {args.good} good, {args.partial} partial, {args.slow} slow-reading "
          f"heavy, {args.heavy} heavy clients (machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    if latencies:
        print(f"good requests answered: {len(latencies)}; latency p50 {statistics.median(latencies) * 1000:.0f} ms, "
              f"p95 {latencies[int(0.95 * (len(latencies) - 1))] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms; "
              f"failed: {len(result['failures'])} {sorted(set(result['failures']))}")
    else:
        print(f"good requests answered: 0; failed: {len(result['failures'])}")
    print(f"heavy responses read whole: {len(result['heavy_done'])} fast, {len(result['slow_done'])} slow "
          f"({(result['heavy_done'] or result['slow_done'] or [0])[0] / 1e6:.1f} MB each)")
    print(f"service memory: {idle_rss / 1e6:.0f} MB idle, {result['peak_rss'] / 1e6:.0f} MB peak")
    drop_lines = text.count("dropped /search")
    print(f"partial connections opened: {result['partial_opened']}; drops counted {result['stats']['dropped']}, "
          f"'dropped /search' log lines {drop_lines}; tracebacks logged: {text.count('Traceback')}")


if __name__ == "__main__":
    main()
