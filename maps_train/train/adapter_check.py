"""Is a saved LoRA adapter one that vLLM's multi-LoRA serving loads? Checked from its files, without loading vLLM
(its list of allowed LoRA ranks is pinned to the installed version's by a test: `allowed_lora_ranks`).

What vLLM (0.32-0.33) refuses or mishandles, mirrored here so a bad adapter fails right after training rather
than when the server starts: a rank above its largest `max_lora_rank` (any r up to the server's
`--max-lora-rank` loads; `maps-train serve` picks the smallest allowed value that covers every adapter); `modules_to_save` (full copies of
embed_tokens / lm_head) and weights for embed_tokens / lm_head (Qwen3 has no LoRA there, and a resized vocabulary
would not match the served base); DoRA, LoRA bias, layer replication, init schemes that change the base weights;
target modules other than the attention and MLP projections. It also wants the base model recorded and no
tokenizer files beside the adapter (per-LoRA tokenizers are deprecated in vLLM and would make it warn).

Weights are read from `adapter_model.safetensors` only: an adapter saved as `adapter_model.bin` (a pickle, which
`torch.load` may execute code from) is reported as a problem and never opened.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_type_hints

from maps_train import safejson
from maps_train.errors import MapsTrainError

# vLLM 0.32's `--max-lora-rank` choices, for the checks that must not import vLLM (importing it costs tens of seconds
# on a CPU, too much for every training process and every recipe check) and where vLLM is not installed; the
# engine process reads the installed version's own list (`allowed_lora_ranks`), and tests/test_native.py fails when
# the two differ, so a vLLM upgrade cannot drift from this copy unnoticed.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@cache
def vllm_lora_ranks() -> tuple[int, ...]:
    """The values the installed vLLM's `--max-lora-rank` accepts (the Literal type of `LoRAConfig.max_lora_rank`),
    in increasing order."""
    if importlib.util.find_spec("vllm") is None:
        return VLLM_LORA_RANKS
    from vllm.config.lora import LoRAConfig

    return tuple(sorted(get_args(get_type_hints(LoRAConfig)["max_lora_rank"])))


def allowed_lora_ranks() -> tuple[int, ...]:
    """vLLM's own list where this process has already imported vLLM (an engine), else the pinned copy: importing
    vLLM only to read it would cost every training process and `maps-train serve` tens of seconds."""
    return vllm_lora_ranks() if "vllm" in sys.modules else VLLM_LORA_RANKS


def rank_problem(rank: object) -> str | None:
    """Why vLLM could not serve a LoRA of this rank (None when it can): a positive int no larger than the largest
    `--max-lora-rank`. vLLM pads every adapter to the server's max rank, so r need not be one of the choices.
    Checked when training configures LoRA (see `allowed_lora_ranks`)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        return f"{rank!r} is not a positive integer rank"
    largest = allowed_lora_ranks()[-1]
    if rank > largest:
        return f"{rank} exceeds the largest rank vLLM serves ({largest})"
    return None
SUPPORTED_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VOCAB_MODULES = ("embed_tokens", "lm_head")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
WEIGHTS = "adapter_model.safetensors"
PICKLED_WEIGHTS = "adapter_model.bin"  # recognised only to say why it is not read


def _weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:  # not iterable itself: .keys() is needed
            return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118
    except Exception as err:  # noqa: BLE001  (safetensors raises its own error types; the user needs one line)
        raise MapsTrainError(f"{path}: not a readable safetensors file ({' '.join(str(err).split())[:200]})") from None


def _read_json_object(path: Path) -> dict[str, Any]:
    """A JSON config file as a dict; bad bytes, bad JSON or a non-object is one line naming the file."""
    try:
        data = safejson.loads(path.read_bytes())
    except safejson.JSONLimitError as err:
        raise MapsTrainError(f"{path}: invalid JSON ({err})") from None
    if not isinstance(data, dict):
        raise MapsTrainError(f"{path}: expected a JSON object")
    return data


def _module_of(key: str) -> str:
    """`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` -> `q_proj`."""
    parts = key.split(".")
    for marker in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"):
        if marker in parts:
            return parts[parts.index(marker) - 1]
    return parts[-2] if len(parts) > 1 else key


def _base_config(base_model: str) -> dict | None:
    from maps_train.models import resolve_model

    folder = Path(resolve_model(base_model))
    config = folder / "config.json"
    if not config.is_file():
        return None  # an online hub id: nothing local to compare against
    raw = _read_json_object(config)
    text_config = raw.get("text_config", raw)
    return text_config if isinstance(text_config, dict) else None


def _expected_in_features(config: dict) -> dict[str, int]:
    sizes = ("hidden_size", "num_attention_heads", "intermediate_size")
    if not all(isinstance(config.get(key), int) and config[key] > 0 for key in sizes):
        return {}  # not a decoder config we know how to read: nothing to compare against
    hidden = config["hidden_size"]
    heads, head_dim = config["num_attention_heads"], config.get("head_dim") or hidden // config["num_attention_heads"]
    return {
        "q_proj": hidden,
        "k_proj": hidden,
        "v_proj": hidden,
        "o_proj": heads * head_dim,
        "gate_proj": hidden,
        "up_proj": hidden,
        "down_proj": config["intermediate_size"],
    }


def check_adapter(path: str | Path, base_model: str | None = None) -> list[str]:
    """Problems that would stop vLLM serving the adapter at `path` (empty when it is fine).

    Raises `MapsTrainError` when `path` is not a PEFT adapter folder at all. With `base_model`, the LoRA input
    sizes are also compared with that model's config (a different base or a resized model shows up there).
    """
    folder = Path(path)
    config_path = folder / "adapter_config.json"
    if not config_path.is_file():
        raise MapsTrainError(f"{folder}: not an adapter folder (no adapter_config.json)")
    config = _read_json_object(config_path)
    problems = config_problems(config)
    if not config.get("base_model_name_or_path"):
        problems.append("base_model_name_or_path is empty (record the base model the adapter was trained on)")
    problems += _weight_problems(folder, config, base_model)
    tokenizer_files = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if tokenizer_files:
        problems.append(f"tokenizer files beside the adapter ({', '.join(tokenizer_files)}): vLLM warns; remove them")
    return problems


def config_problems(config: dict[str, Any]) -> list[str]:
    """What in an adapter config (adapter_config.json, or a `LoraConfig.to_dict()` before training) vLLM would not
    serve. The same rules run before training (`maps_train.train.sft.build_lora_config`) and after it."""
    problems: list[str] = []
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, vLLM serves LORA adapters only")
    if (why := rank_problem(config.get("r"))) is not None:
        problems.append(f"r: {why}")
    for module, module_rank in (config.get("rank_pattern") or {}).items():
        if (why := rank_problem(module_rank)) is not None:
            problems.append(f"rank_pattern[{module}]: {why}")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save={config['modules_to_save']} (vLLM loads no full-module copies)")
    if config.get("trainable_token_indices"):
        problems.append("trainable_token_indices is set (new token embeddings; the vocabulary must stay the base's)")
    for flag, what in (("use_dora", "DoRA"), ("lora_bias", "LoRA bias"), ("layer_replication", "layer replication")):
        if config.get(flag):
            problems.append(f"{flag} is set: vLLM does not support {what}")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        problems.append(f"init_lora_weights={init!r} changes the base weights when loaded; vLLM cannot serve it")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        problems.append(f"target_modules is a pattern ({targets!r}); save the resolved module list")
    else:
        for name in sorted(targets or []):
            if name.split(".")[-1] not in SUPPORTED_MODULES:
                problems.append(f"target module {name!r} is not one of {', '.join(SUPPORTED_MODULES)}")
    return problems


def _weight_problems(folder: Path, config: dict[str, Any], base_model: str | None) -> list[str]:
    problems: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    if (folder / WEIGHTS).is_file():
        shapes = _weight_shapes(folder / WEIGHTS)
    elif (folder / PICKLED_WEIGHTS).is_file():
        problems.append(
            f"{PICKLED_WEIGHTS} without {WEIGHTS}: pickled weights are not loaded (torch.load can run code); "
            f"save the adapter with safe_serialization=True"
        )
    else:
        problems.append(f"no adapter weights ({WEIGHTS})")
    vocab_keys = sorted(key for key in shapes if any(part in key.split(".") for part in VOCAB_MODULES))
    if vocab_keys:
        problems.append(f"weights for embed_tokens/lm_head ({vocab_keys[0]}, ...): vocabulary layers must stay frozen")
    modules = {_module_of(key) for key in shapes} - set(VOCAB_MODULES)
    unsupported = sorted(modules - set(SUPPORTED_MODULES))
    if unsupported:
        problems.append(f"weights for unsupported modules: {', '.join(unsupported)}")
    base_config = _base_config(base_model) if base_model else None
    expected = _expected_in_features(base_config) if base_config else {}
    for key, shape in sorted(shapes.items()):
        if ".lora_A." in key and len(shape) == 2:
            module = _module_of(key)
            module_rank = (config.get("rank_pattern") or {}).get(module, config.get("r"))
            if shape[0] != module_rank:
                problems.append(f"{key}: rank {shape[0]} differs from r={module_rank} in adapter_config.json")
                break
            if module in expected and shape[1] != expected[module]:
                problems.append(
                    f"{key}: input size {shape[1]} does not match {base_model} ({module} takes {expected[module]})"
                )
                break
    return problems


def require_valid_adapter(path: str | Path, base_model: str | None = None) -> None:
    """`check_adapter`, raising one `MapsTrainError` line listing every problem."""
    problems = check_adapter(path, base_model)
    if problems:
        raise MapsTrainError(f"{path}: adapter vLLM would not serve: " + "; ".join(problems))
