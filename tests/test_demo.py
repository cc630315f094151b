"""The main job, shortened: `maps-train demo --quick` runs every stage offline on CPU and writes its report."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from maps_train.platform import free_port


@pytest.mark.slow
# Its own subprocess budgets (1800 s + 600 s), not the suite's 900 s: the quick demo took 495 s alone on a Zen 4
# machine, and was still training at 900 s on an AVX2-only one with a CI run beside it.
@pytest.mark.timeout(2400)
def test_quick_demo_runs_the_whole_pipeline(tmp_path, repo_root, smollm2, minilm):
    import psutil

    from maps_train.serve.server import ensure_port_free

    out = tmp_path / "demo"
    env = dict(os.environ)
    port = free_port()  # its own port: a user's `make demo` on the recipe's 8011 may be running
    done = subprocess.run(  # SIGINT ignored, as a background job of a script or CI step inherits it
        [sys.executable, "-m", "maps_train.cli", "demo", "--quick", "--out", str(out), f"serve.port={port}"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=1800,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # The demo stopped its server, vLLM included: nothing listens on its port, and no vLLM process is left behind
    # (the demo used to stop it with a SIGINT, which such a job ignores, and left vLLM running orphaned).
    ensure_port_free("127.0.0.1", port)
    left = [" ".join(proc.info["cmdline"] or []) for proc in psutil.process_iter(["cmdline"])]
    left = [command for command in left if f"--port {port}" in command]
    assert not left, left

    # Every stage left its artefact.
    assert (out / "index" / "manifest.json").is_file()
    traces = list((out / "traces").rglob("traces.jsonl"))
    assert traces and sum(1 for _ in traces[0].open()) == 6
    for adapter in ("proposer", "writer", "consolidator"):
        assert (out / "sft" / adapter / "train.jsonl").is_file()
        summary = json.loads((out / "adapters" / adapter / "train_summary.json").read_text())
        assert summary.get("world_size") == 2  # trained under accelerate launch with 2 processes
    results = [json.loads(line) for line in (out / "eval" / "results.jsonl").read_text().splitlines()]
    systems = {row["system"] for row in results}
    assert systems == {"teacher_maps", "distilled_maps", "vanilla_rag", "search_o1", "student_base_free",
                       "distilled_free"}
    assert len(results) == 6 * 3
    assert all(row["cost"]["calls"] > 0 for row in results)

    # The distilled system's calls were served by the role adapters through the vLLM server.
    trace_path = out / "eval" / "runs" / "distilled_maps" / "demo" / "traces.jsonl"
    calls = [call for line in trace_path.read_text().splitlines()
             for rnd in json.loads(line)["rounds"] for call in rnd["calls"]]
    served = {(call["role"], call["usage"]["model"]) for call in calls}
    assert {("proposer", "proposer"), ("writer", "writer"), ("consolidator", "consolidator")} <= served
    # ...and so were every other system's and the teacher's traces (the demo's teacher is the student base, which
    # that one server holds from the start): it answered at least one request per call booked by the teacher's
    # traces and by all six systems, and it got the three adapters at run time, after training.
    server_log = (out / "logs" / "serve-vllm.log").read_text(errors="replace")
    requests = server_log.count("POST /v1/chat/completions") + server_log.count("POST /v1/completions")
    teacher_calls = sum(json.loads(line)["cost"]["calls"] for line in (traces[0].parent / "answers.jsonl").open())
    assert requests >= teacher_calls + sum(row["cost"]["calls"] for row in results) > teacher_calls > 0
    assert server_log.count("POST /v1/load_lora_adapter HTTP/1.1\" 200") == 3
    assert server_log.count("Application startup complete") == 1  # one server start (uvicorn's line)

    # The paper's analyses (momentum, drift, stop rounds) from the demo's own eval runs, in one command.
    analysis = subprocess.run(
        [sys.executable, "-m", "maps_train.cli", "analyze", "suite", str(out / "eval"), "--encoder", minilm,
         "--corpus", "data/demo/corpus.jsonl"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert analysis.returncode == 0, analysis.stdout[-3000:] + analysis.stderr[-3000:]
    stops = (out / "eval" / "analysis" / "stops" / "stops.md").read_text()
    assert all(f"| {system} |" in stops for system in systems)

    report = (out / "REPORT.md").read_text()
    assert "Student vs teacher" in report and "without constrained decoding" in report
    assert (out / "eval" / "cover_em_vs_cost.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "wandb").rglob("offline-run-*")), "no offline W&B run"
    assert "artefacts" in done.stdout
    assert "expected here, at this machine's pace so far: traces" in done.stdout  # said after the first step


def test_demo_refuses_a_taken_port_before_any_step(tmp_path, repo_root):
    """Another server on the demo's port (a second demo, say): one line, and no step starts. Without the check the
    steps would wait for /health, get the other server's answer and send it the teacher's requests."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "maps_train.cli", "demo", "--quick", "--out", str(tmp_path / "demo"),
             f"serve.port={port}"],
            cwd=repo_root, capture_output=True, text=True, timeout=300,
        )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"maps-train: error: serve.port {port} on 127.0.0.1 is taken (Address already in use): another server is "
        f"listening there; stop it or pick a free port (serve.port=...)"]
    assert not (tmp_path / "demo" / "logs").exists() and not (tmp_path / "demo" / "index").exists()


def test_the_demo_expects_each_step_at_this_machines_pace_on_its_kind_of_work():
    from maps_train.demo import PACE_REFERENCE_S, expected_s

    reference = PACE_REFERENCE_S[False]
    # After the first step, a machine twice as slow as the reference run expects every other step twice as long.
    assert expected_s({"index": 2 * reference["index"]}, quick=False) == pytest.approx(
        {step: 2 * seconds for step, seconds in reference.items() if step != "index"})
    # Then generation (the eval) goes at the traces' pace, training at the other steps'.
    rest = expected_s({"index": reference["index"], "traces": 3 * reference["traces"],
                       "sft-data": reference["sft-data"]}, quick=False)
    assert rest == pytest.approx({"train": reference["train"], "load-adapters": reference["load-adapters"],
                                  "eval": 3 * reference["eval"]})
    assert expected_s({}, quick=True) == {} and expected_s(dict(PACE_REFERENCE_S[True]), quick=True) == {}
