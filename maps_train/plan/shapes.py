"""A model's sizes, from its own `config.json` where one is at hand, else from the files shipped in `models/`.

Each shipped file holds the config.json values the plan needs, where each came from, and what could not be
confirmed. A local folder (or a `builtin:` model, materialised as its loaders would) is read directly; a hub id is
read from the Hugging Face cache when it is downloaded there (its own config wins), else from the shipped files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError

MODELS_DIR = Path(__file__).with_name("models")


@dataclass(frozen=True)
class ModelShape:
    """The config.json values that decide memory (names as in transformers' configs)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int = 0  # 0: a dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    full_attention_interval: int = 1  # hybrid models: one full-attention layer in this many (the rest linear)
    attn_output_gate: bool = False
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    source: str = ""

    @property
    def attention_layers(self) -> int:
        """Layers that keep a KV cache (all of them, except a hybrid's linear-attention layers)."""
        return self.num_hidden_layers // self.full_attention_interval

    @property
    def linear_layers(self) -> int:
        return self.num_hidden_layers - self.attention_layers

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    def _attention_parameters(self) -> int:
        h, q, kv = self.hidden_size, self.q_dim, self.kv_dim
        gate = q if self.attn_output_gate else 0  # Qwen3.6's gated attention doubles q_proj's output
        return h * (q + gate) + 2 * h * kv + q * h + 2 * self.head_dim  # q, k, v, o projections; q/k norms

    def _linear_attention_parameters(self) -> int:
        """A Gated DeltaNet layer: q, k, v, z projections, the b/a gates, the causal conv, the output projection."""
        h = self.hidden_size
        keys = self.linear_num_key_heads * self.linear_key_head_dim
        values = self.linear_num_value_heads * self.linear_value_head_dim
        conv = (2 * keys + values) * self.linear_conv_kernel_dim
        return h * (2 * keys + 2 * values) + h * 2 * self.linear_num_value_heads + conv + values * h

    def _mlp_parameters(self, experts: int) -> int:
        if not self.num_experts:
            return 3 * self.hidden_size * self.intermediate_size
        routed = experts * 3 * self.hidden_size * self.moe_intermediate_size
        shared = 3 * self.hidden_size * self.shared_expert_intermediate_size
        return routed + shared + self.hidden_size * self.num_experts  # + the router

    def parameters(self, active: bool = False) -> int:
        """Weights in all (or, `active`, those one token passes through: the routed experts it is sent to)."""
        experts = self.num_experts_per_tok if active else self.num_experts
        layers = (self.attention_layers * self._attention_parameters()
                  + self.linear_layers * self._linear_attention_parameters()
                  + self.num_hidden_layers * (self._mlp_parameters(experts) + 2 * self.hidden_size))
        return layers + self.embedding_parameters() + self.hidden_size

    def lora_parameters(self, rank: int) -> int:
        """LoRA A and B of every attention and MLP projection (`all-linear`, what vLLM serves): rank x (in + out)."""
        h, q, kv, i = self.hidden_size, self.q_dim, self.kv_dim, self.intermediate_size
        per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return rank * per_layer * self.num_hidden_layers


SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
OPTIONAL_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                 "full_attention_interval", "attn_output_gate", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")


MAX_CONFIG_BYTES = 4 * 1024 * 1024


def _check_numbers(config: Any, source: str) -> None:
    """Sizes are counts: each present one an integer (not a boolean), the shape's own at least 1, the optional
    ones at least 0; `attn_output_gate` a boolean. A bad one is one line naming the key, never a negative size."""
    if not isinstance(config, dict):
        raise MapsTrainError(f"{source}: config.json is not a JSON object")
    for key in (*SHAPE_KEYS, "num_key_value_heads", "head_dim", *OPTIONAL_KEYS):
        value, least = config.get(key), 1 if key in SHAPE_KEYS or key in ("num_key_value_heads", "head_dim") else 0
        if value is None or (key in SHAPE_KEYS and not isinstance(value, int)):
            continue  # absent: the caller names what is missing
        if key == "attn_output_gate":
            if not isinstance(value, bool):
                raise MapsTrainError(f"{source}: config.json {key}: expected true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise MapsTrainError(f"{source}: config.json {key}: expected an integer >= {least}, got {value!r}")
    if "layer_types" in config and not isinstance(config["layer_types"], list):
        raise MapsTrainError(f"{source}: config.json layer_types: expected a list")


def shape_from_config(config: dict[str, Any], name: str, source: str) -> ModelShape:
    """A ModelShape from config.json's values (a multimodal config's language model is under `text_config`)."""
    config = config.get("text_config") or config if isinstance(config, dict) else config
    _check_numbers(config, source)
    # A mixture of experts written by transformers' own class (Qwen3.5/3.6-MoE: Qwen3_5MoeTextConfig) has no dense
    # intermediate_size: every layer's MLP is its experts, sized by moe_intermediate_size.
    dense_width = "moe_intermediate_size" if config.get("num_experts") else "intermediate_size"
    width = config.get("intermediate_size") if isinstance(config.get("intermediate_size"), int) else \
        config.get(dense_width)
    missing = [key for key in SHAPE_KEYS if not isinstance(config.get(key), int)]
    if not isinstance(width, int):
        missing.append(dense_width)
    if missing:
        raise MapsTrainError(f"{source}: config.json has no integer {missing[0]} (needed to size model '{name}')")
    if isinstance(width, bool) or width < 1:
        raise MapsTrainError(f"{source}: config.json {dense_width}: expected an integer >= 1, got {width!r}")
    heads = config["num_attention_heads"]
    extra = {key: config[key] for key in OPTIONAL_KEYS if config.get(key) is not None}
    if "layer_types" in config and "full_attention_interval" not in extra:
        full = sum(1 for kind in config["layer_types"] if kind == "full_attention")
        extra["full_attention_interval"] = max(1, config["num_hidden_layers"] // max(1, full))
    return ModelShape(
        name=name,
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        intermediate_size=width,
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        source=source,
        **extra,
    )


@cache
def shipped() -> dict[str, dict[str, Any]]:
    """The shipped model files, by lower-cased hub id."""
    files = {}
    for path in sorted(MODELS_DIR.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        files[doc["model"].lower()] = {**doc, "file": path}
    return files


def _config_file(name: str) -> Path | None:
    """config.json of a builtin, a local folder, or a hub id already in the Hugging Face cache."""
    if name.startswith("builtin:"):
        from maps_train.models import resolve_model

        return Path(resolve_model(name)) / "config.json"
    folder = Path(name).expanduser()
    if folder.is_dir():
        return folder / "config.json" if (folder / "config.json").is_file() else None
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):  # a hub id: its own config when cached
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(name, "config.json")
        return Path(found) if isinstance(found, str) else None
    return None


def model_shape(name: str) -> ModelShape:
    """The sizes of model `name`; a one-line error naming what would work when none are at hand."""
    path = _config_file(name)
    if path is not None and path.is_file():
        try:
            config = json.loads(path.read_bytes()[:MAX_CONFIG_BYTES + 1])
        except (OSError, ValueError) as err:
            raise MapsTrainError(f"{path}: config.json does not read as JSON ({' '.join(str(err).split())[:200]})"
                                 ) from None
        return shape_from_config(config, name, str(path))
    doc = shipped().get(name.lower())
    if doc is None:
        raise MapsTrainError(
            f"model '{name}': no config.json at hand and no shipped sizes (shipped: "
            f"{', '.join(d['model'] for d in shipped().values())}); name a local folder that holds its config.json"
        )
    return shape_from_config(doc["config"], name, str(doc["file"]))
