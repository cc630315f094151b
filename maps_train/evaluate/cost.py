"""Cost of an answer: model sizes and the estimated compute 2 x parameters x tokens.

The paper reports accuracy only; a 0.6B student and a 32B teacher answering in the same number of calls are not
equally expensive, so every result also carries an estimated forward-pass compute: for each role,
2 x (parameters of the model that role ran on) x (prompt + completion tokens). LoRA adapters add well under 1%
of the parameters and are ignored; retrieval (the encoder and the index) is counted separately as retrievals.

Parameter counts come, in order, from: the system's `params_billion` (the suite says it), the tensor shapes in
the model folder's safetensors headers (exact, no weights read), the folder's `config.json` (a decoder-only
estimate), or a size written in the model's name ("Qwen/Qwen3-32B" -> 32e9). None when nothing says.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError


def safetensors_parameters(folder: Path) -> int | None:
    """Exact parameter count from the headers of every *.safetensors file in `folder` (the library reads only the
    header; no weights are loaded)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        try:
            with safe_open(str(file), framework="numpy") as handle:  # not iterable itself: .keys() is needed
                total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118
        except Exception as err:  # noqa: BLE001  (safetensors raises its own error types; the user needs one line)
            raise MapsTrainError(f"{file}: not a readable safetensors file ({' '.join(str(err).split())[:200]})") from None
    return total


def config_parameters(config: dict[str, Any]) -> int | None:
    """Decoder-only estimate from a transformers config (attention with GQA, gated MLP, embeddings, norms)."""
    config = config.get("text_config", config)
    try:
        hidden = config["hidden_size"]
        layers = config["num_hidden_layers"]
        inter = config["intermediate_size"]
        vocab = config["vocab_size"]
    except KeyError:
        return None
    heads = config.get("num_attention_heads", 1)
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * inter
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", False) else 2)
    return layers * (attention + mlp + 2 * hidden) + embeddings + hidden


def name_parameters(name: str) -> int | None:
    """A size written in the name ("Qwen3-32B", "qwen3-0.6b", "SmolLM2-135M-Instruct")."""
    match = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)\s*([bBmM])(?![a-zA-Z])", Path(name).name)
    if not match:
        return None
    scale = 1e9 if match.group(2).lower() == "b" else 1e6
    return int(float(match.group(1)) * scale)


@lru_cache(maxsize=64)
def count_parameters(model: str) -> int | None:
    """Parameters of a model named as a recipe names it (builtin:, local folder, hub id); None when unknown."""
    from maps_train.models.resolve import resolve_model

    try:
        location = Path(resolve_model(model))
    except MapsTrainError:
        location = None
    if location is not None and location.is_dir():
        exact = safetensors_parameters(location)
        if exact:
            return exact
        config_file = location / "config.json"
        if config_file.is_file():
            estimate = config_parameters(json.loads(config_file.read_text()))
            if estimate:
                return estimate
    return name_parameters(model)


class ParameterLookup:
    """Parameters per role for one system: `params_billion` for every role when given, else the role's model."""

    def __init__(self, recipe: Any, params_billion: float | None = None):
        self.recipe = recipe
        self.params_billion = params_billion
        self._cache: dict[str, int | None] = {}

    def __call__(self, role: str) -> int | None:
        if self.params_billion is not None:
            return int(self.params_billion * 1e9)
        if role not in self._cache:
            try:
                self._cache[role] = count_parameters(self.recipe.route(role).model)
            except MapsTrainError:
                self._cache[role] = None
        return self._cache[role]


def compute_flops(cost: dict[str, Any], params_for_role: Callable[[str], int | None]) -> float | None:
    """2 x parameters x tokens, summed over the roles in `cost["by_role"]` (the "default" route without roles).

    None when some role that used tokens runs on a model of unknown size.
    """
    by_role = cost.get("by_role") or {
        "default": {"prompt_tokens": cost.get("prompt_tokens"), "completion_tokens": cost.get("completion_tokens")}
    }
    total = 0.0
    for role, usage in by_role.items():
        tokens = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
        if tokens == 0:
            continue
        params = params_for_role(role)
        if not params:
            return None
        total += 2.0 * params * tokens
    return total
