"""From a distillation recipe and an adapter set (`maps_train.adapters`) to a vLLM multi-LoRA server command and the
role routing that uses it (the set's own routes, by served adapter name)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from maps_train.adapters import AdapterSet, distilled_set, student_routes
from maps_train.adapters.student import student_base
from maps_train.config.redaction import redact_secrets
from maps_train.errors import MapsTrainError
from maps_train.library_options import LoraOptions
from maps_train.llm.thinking import model_can_think
from maps_train.models.resolve import resolve_model
from maps_train.platform import cpu_scheduler_kwargs, lora_slots, vllm_dtype, vllm_on_cpu
from maps_train.recipe import Recipe, RoleRoute, adapter_names

RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's switch for /v1/load_lora_adapter


@dataclass
class ServerPlan:
    base_model: str  # resolved path or hub id
    adapters: dict[str, str]  # served adapter name -> folder
    max_lora_rank: int
    command: list[str]
    url: str
    routes: dict[str, RoleRoute]  # role -> route for the agent (backend openai, adapter = served name)
    cpu_kv_cache_gib: int = 2  # VLLM_CPU_KVCACHE_SPACE when the server runs on vLLM-CPU
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # set for the server process
    memory: str = ""  # what the server may take, as `maps-train plan` budgets it (printed by --dry-run)

    def shown_command(self) -> str:
        """The command as printed or logged: secrets (`--api-key` in `serve.extra_args`, a URL's user:password) as
        ***. `command` itself, which starts the server, keeps them."""
        return shlex.join(redact_secrets(self.command))


def _read_adapter_config(name: str, folder: Path) -> dict:
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise MapsTrainError(f"adapter '{name}': {config_path} not found (train it first: maps-train train RECIPE)")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise MapsTrainError(f"{config_path}: invalid JSON ({err.msg})") from None


def _same_base(recorded: str | None, base: str, base_name: str) -> bool:
    if not recorded:
        return True
    if recorded in (base, base_name):
        return True
    try:
        return Path(recorded).resolve() == Path(base).resolve()
    except OSError:
        return False


def check_adapters(recipe: Recipe, adapter_set: AdapterSet) -> tuple[str, dict[str, Path], int]:
    """The adapters of `adapter_set` with weights exist, each passes the vLLM adapter check, all were trained on
    this base; returns the max rank. An adapter that learned nothing (no SFT rows: `train.unlearned`) has no
    weights to load; the base serves its roles."""
    from maps_train.train.adapter_check import allowed_lora_ranks, check_adapter

    base_name = student_base(recipe)
    base = resolve_model(base_name)
    adapters = adapter_set.served()
    ranks = []
    for name, folder in adapters.items():
        config = _read_adapter_config(name, folder)
        recorded = config.get("base_model_name_or_path")
        if not _same_base(recorded, base, base_name):
            raise MapsTrainError(
                f"adapter '{name}' ({folder}): trained on base '{recorded}', but the server base is '{base_name}' ({base})"
            )
        # Tokenizer files beside an adapter only make vLLM warn; every other problem would stop the server.
        problems = [p for p in check_adapter(folder, base) if not p.startswith("tokenizer files")]
        if problems:
            raise MapsTrainError(f"adapter '{name}' ({folder}): vLLM would not serve it: " + "; ".join(problems))
        ranks.append(max([int(config.get("r", 0)), *(config.get("rank_pattern") or {}).values()]))
    if not adapters:
        raise MapsTrainError("serve: no adapter to serve (sft_data.adapter_roles is empty, or every adapter learned "
                             "nothing: serve the base model)")
    max_rank = next((r for r in allowed_lora_ranks() if r >= max(ranks)), None)
    if max_rank is None:
        raise MapsTrainError(f"serve: adapter rank {max(ranks)} exceeds vLLM's largest ({allowed_lora_ranks()[-1]})")
    return base, adapters, max_rank


def _vllm_serve(base: str) -> list[str]:
    """`vllm serve BASE`, run as the module behind it: the `vllm` console script looks up the distribution named
    `vllm` and fails under vLLM's CPU build (distributed as `vllm-cpu`); the module works with every build."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", base]


def planned_rank(recipe: Recipe) -> int:
    """The `--max-lora-rank` of a server started before its adapters exist: the smallest vLLM rank that holds
    `train.lora.r` (and `backend.max_lora_rank`)."""
    from maps_train.train.adapter_check import allowed_lora_ranks

    wanted = max(LoraOptions.of(recipe.train.lora).r, int(recipe.backend.max_lora_rank or 0))
    rank = next((r for r in allowed_lora_ranks() if r >= wanted), None)
    if rank is None:
        raise MapsTrainError(f"serve: LoRA rank {wanted} exceeds vLLM's largest ({allowed_lora_ranks()[-1]})")
    return rank


def plan_server(recipe: Recipe, adapter_set: AdapterSet | None = None, adapters_later: bool = False) -> ServerPlan:
    """The `vllm serve` command for the recipe's student base and the role adapters of `adapter_set` (default: the
    recipe's distilled set, `adapters.distilled_set`).

    `adapters_later`: start before the adapters exist (the demo serves the teacher's traces from the same server
    before training): LoRA slots for every adapter the recipe trains and vLLM's runtime adapter loading switched on,
    no adapter loaded; `load_adapters()` loads them once trained, checked the same way."""
    adapter_set = adapter_set if adapter_set is not None else distilled_set(recipe)
    if adapters_later:
        base = resolve_model(student_base(recipe))
        adapters, max_rank = adapter_set.served(), planned_rank(recipe)
        loaded: list[str] = []
        env = {RUNTIME_LORA_ENV: "True"}
    else:
        base, adapters, max_rank = check_adapters(recipe, adapter_set)
        loaded = ["--lora-modules", *[f"{name}={folder}" for name, folder in adapters.items()]]
        env = {}
    serve, backend = recipe.serve, recipe.backend
    thinking = {"enable_thinking": recipe.sft_data.enable_thinking}
    command = [
        *_vllm_serve(base),
        "--host", serve.host, "--port", str(serve.port),
        "--enable-lora",
        *loaded,
        "--max-loras", str(lora_slots(len(adapters), cpu=vllm_on_cpu())),
        "--max-lora-rank", str(max_rank),
        "--dtype", vllm_dtype(backend.dtype, cpu=vllm_on_cpu()),
        "--max-model-len", str(backend.max_model_len),
        # Render prompts exactly as training did (Qwen3 thinking on/off), whatever the client sends by default.
        "--default-chat-template-kwargs", json.dumps(thinking),
    ]
    if backend.enforce_eager:
        command.append("--enforce-eager")
    if vllm_on_cpu():  # seeded requests die on a split prefill there (see platform.cpu_scheduler_kwargs)
        scheduler = cpu_scheduler_kwargs(backend.max_model_len)
        command += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(scheduler["max_num_batched_tokens"])]
    if backend.structured_disable_whitespace:
        # Small models loop on blank lines inside constrained JSON; this is engine-wide in vLLM.
        command += ["--structured-outputs-config", json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]
    # The student's own parallelism, always written out: the teacher's backend.tensor_parallel_size, which student
    # overlays inherit, never reaches the student's server.
    command += ["--tensor-parallel-size", str(serve.tensor_parallel_size)]
    if backend.language_model_only:
        command.append("--language-model-only")
    utilization = server_memory_fraction(recipe)
    if vllm_on_cpu():  # vLLM-CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not from a GPU fraction
        memory = f"VLLM_CPU_KVCACHE_SPACE={backend.cpu_kv_cache_gib} GiB of host memory for the KV cache"
    else:
        command += ["--gpu-memory-utilization", f"{utilization:g}"]
        memory = (f"--gpu-memory-utilization {utilization:g} of each of its {serve.tensor_parallel_size} GPU(s), "
                  f"the fraction maps-train plan budgets (serve.gpu_memory_utilization, else backend's)")
    if recipe.sft_data.enable_thinking and model_can_think(base):
        # The served routes think: the server returns the reasoning apart, counts its tokens, and starts a JSON
        # grammar only after `</think>` (without it the grammar would forbid thinking).
        command += ["--reasoning-parser", "qwen3"]
    command += serve.extra_args
    url = f"http://{serve.host}:{serve.port}/v1"
    return ServerPlan(base, {k: str(v) for k, v in adapters.items()}, max_rank, command, url,
                      student_routes(recipe, adapter_set, via="server", base=base), backend.cpu_kv_cache_gib, env,
                      memory)


@dataclass(frozen=True)
class ServerSize:
    """What `maps-train serve` gives vLLM that sizes it, decided before any adapter exists: the base as the recipe
    names it, the adapters it serves, `--max-lora-rank` (`planned_rank`), `--tensor-parallel-size` and
    `--gpu-memory-utilization` (`server_memory_fraction`). `maps-train plan` sizes the server from this."""

    base_model: str
    adapters: int
    max_lora_rank: int
    tensor_parallel_size: int
    gpu_memory_utilization: float


def server_size(recipe: Recipe) -> ServerSize:
    return ServerSize(student_base(recipe), len(adapter_names(recipe)),
                      planned_rank(recipe), recipe.serve.tensor_parallel_size, server_memory_fraction(recipe))


def server_memory_fraction(recipe: Recipe) -> float:
    """The share of each GPU `maps-train serve` gives vLLM: `serve.gpu_memory_utilization`, else the backend's
    (vLLM's own default, 0.9, is never left to apply: the plan budgets this fraction)."""
    return recipe.serve.gpu_memory_utilization or recipe.backend.gpu_memory_utilization
