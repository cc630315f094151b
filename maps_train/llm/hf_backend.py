"""transformers + PEFT backend: one base model on CPU (or one GPU) holding every role's LoRA adapter.

A batch whose rows use different adapters runs as one `generate(..., adapter_names=[...])` call (PEFT's mixed
adapter batches; `"__base__"` is the bare model). Prompts are left-padded. Rows are grouped by sampling settings
(one generation config per call) and split into `hf_batch_size` chunks. JSON schemas are NOT enforced here
(no constrained decoding): completions say `constrained=False` and callers parse tolerantly. Sampling is the
route's in full (top_k, min_p, repetition and presence penalty: the last a logits processor of our own, as
transformers has none), never the model's `generation_config.json` defaults. Thinking is the
template's `enable_thinking` (route or request); the reasoning is split off the decoded text, so a role's output is
parsed from what follows `</think>`. A raw continuation is the rendered prompt plus the text, tokenised once.

Seeds: `generate` draws every row of a batch from one torch generator, so a row's tokens would depend on its
batch mates. A sampled row with a seed therefore runs ALONE, under `torch.manual_seed(seed)` inside
`torch.random.fork_rng` (the caller's global RNG state is left as it was): the same seed and request give the same
text in any batch. The cost is one `generate` call per seeded sampled row (a sampled teacher run on this backend
loses batching); greedy rows, and sampled rows without a seed, still batch.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.adapter_folders import adapter_dir, adapter_name
from maps_train.llm.call_spec import CallSpec, call_spec, default_route, first_stop
from maps_train.llm.prompt_fit import fit_request
from maps_train.llm.thinking import decode_generated, generation_opens_thinking, reasoning_token_count, split_thinking
from maps_train.llm.types import ChatRequest, Completion
from maps_train.models.resolve import require_safetensors_adapter
from maps_train.recipe import BackendConfig, RoleRoute

BASE = "__base__"


class HFBackend:
    kind = "hf"
    concurrent = False  # one generate() at a time: the continuous schedule coalesces calls for it

    def __init__(self, model: str, config: BackendConfig | None = None, device: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from maps_train.models import resolve_model

        self.config = config or BackendConfig()
        self.model_name = model
        path = resolve_model(model)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = self.config.dtype
        if dtype == "auto":
            dtype = "float32" if self.device == "cpu" else "bfloat16"
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.max_model_len = min(
            self.config.max_model_len, getattr(self.model.config, "max_position_embeddings", 1 << 30)
        )
        self._adapters: dict[str, str] = {}  # adapter folder -> PEFT adapter name

    # -- adapters -------------------------------------------------------------------------------------------

    def load_adapter(self, path: str, role: str = "?") -> str:
        """Load a LoRA folder once (under a name derived from its folder name); returns the adapter name."""
        if path in self._adapters:
            return self._adapters[path]
        folder = adapter_dir(path, role)
        # PEFT silently falls back to torch.load of adapter_model.bin: refuse pickles before it looks
        require_safetensors_adapter(folder, f"roles.{role}.adapter")
        name = adapter_name(path)
        taken = set(self._adapters.values())
        suffix = 2
        while name in taken or name == BASE:
            name, suffix = f"{adapter_name(path)}_{suffix}", suffix + 1
        from peft import PeftModel

        # No use_safetensors here: PEFT's local loader does not read it (it picks whichever file exists), so the
        # check above is what keeps pickles out.
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(str(folder), adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, str(folder), adapter_name=name)
        self.model.eval()
        self._adapters[path] = name
        return name

    # -- generation -----------------------------------------------------------------------------------------

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        routes = routes or [default_route(self.model_name)] * len(requests)
        specs = [call_spec(req, route) for req, route in zip(requests, routes)]
        names = [self.load_adapter(s.adapter, s.request.role) if s.adapter else BASE for s in specs]
        results: list[Completion | None] = [None] * len(specs)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, spec in enumerate(specs):
            groups[_group_key(spec, i)].append(i)
        size = max(1, self.config.hf_batch_size)
        for rows in groups.values():
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                for i, comp in zip(chunk, self._generate_chunk([specs[i] for i in chunk], [names[i] for i in chunk])):
                    results[i] = comp
        return results  # type: ignore[return-value]

    def _generate_chunk(self, specs: list[CallSpec], names: list[str]) -> list[Completion]:
        import torch
        from peft import PeftModel

        tok = self.tokenizer
        fitted = [fit_request(tok, s, self.max_model_len, self.config.truncate_prompt) for s in specs]
        texts = [f.text for f in fitted]
        prompts = [f.ids for f in fitted]
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        spec = specs[0]  # the chunk shares its sampling settings
        gen = self._generation_config(spec)
        kwargs: dict[str, Any] = {}
        if isinstance(self.model, PeftModel):
            kwargs["adapter_names"] = names
        elif any(n != BASE for n in names):
            raise MapsTrainError("hf backend: an adapter was requested but none is loaded")
        if spec.stop:
            kwargs.update(stop_strings=spec.stop, tokenizer=tok)
        if spec.presence_penalty:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([PresencePenalty(spec.presence_penalty, width)])
        start = time.perf_counter()
        with seeded_rng(None if spec.greedy else spec.seed, self.device), torch.inference_mode():
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, generation_config=gen, **kwargs)
        latency = time.perf_counter() - start
        eos_ids = set(_as_list(gen.eos_token_id))
        completions = []
        for row, (s, name) in enumerate(zip(specs, names)):
            new, finish = cut_at_eos(out[row, width:].tolist(), gen.eos_token_id)
            if finish == "length":
                # generate pads rows that finished early on a stop string; drop the padding
                while new and new[-1] == pad and pad not in eos_ids:
                    new.pop()
            text = decode_generated(tok, new)
            text, stopped = first_stop(text, s.stop)
            if stopped is not None:
                finish = "stop"
            answer, reasoning = split_thinking(text, generation_opens_thinking(texts[row], s))
            completions.append(
                Completion(
                    text=answer,
                    reasoning=reasoning,
                    generated=text,
                    prompt_tokens=len(prompts[row]),
                    completion_tokens=len(new),
                    reasoning_tokens=reasoning_token_count(new, tok, answer, reasoning),
                    latency_s=latency,
                    model=self.model_name,
                    adapter=None if name == BASE else name,
                    finish_reason=finish,
                    stop_string=stopped,
                    role=s.request.role,
                    constrained=False,
                    **s.sampling_used(),
                    **fitted[row].completion_fields(),
                )
            )
        return completions

    def _generation_config(self, spec: CallSpec):
        import copy

        gen = copy.deepcopy(self.model.generation_config)
        gen.max_new_tokens = spec.max_tokens
        gen.max_length = None
        gen.pad_token_id = self.tokenizer.pad_token_id
        if gen.eos_token_id is None:
            gen.eos_token_id = self.tokenizer.eos_token_id
        # Every sampling field set from the route, none kept from the model's generation_config.json (Qwen3's
        # says top_k 20, which vLLM in process would not apply): the same values reach every backend.
        if not spec.greedy:
            gen.do_sample, gen.temperature, gen.top_p = True, spec.temperature, spec.top_p
            gen.top_k, gen.min_p = spec.top_k, spec.min_p or None  # 0: no top-k
        else:
            gen.do_sample, gen.temperature, gen.top_p, gen.top_k, gen.min_p = False, None, None, None, None
        gen.repetition_penalty = spec.repetition_penalty
        return gen

    def close(self) -> None:
        self.model = None
        import gc

        gc.collect()


class PresencePenalty:
    """vLLM's (and the OpenAI API's) presence penalty, which transformers lacks: `penalty` off the logit of every
    token the row has generated so far (not the prompt's, which start `prompt_width` columns of left-padded ids)."""

    def __init__(self, penalty: float, prompt_width: int):
        self.penalty, self.prompt_width = penalty, prompt_width

    def __call__(self, input_ids, scores):
        generated = input_ids[:, self.prompt_width :]
        if generated.shape[1]:
            seen = scores.new_zeros(scores.shape, dtype=scores.dtype).scatter_(1, generated, 1.0)
            scores = scores - self.penalty * seen
        return scores


def _group_key(spec: CallSpec, row: int) -> tuple:
    """Rows with equal keys share a `generate` call; a seeded sampled row gets a key of its own (see above)."""
    if not spec.greedy and spec.seed is not None:
        return (*spec.sampling_key(), "row", row)
    return spec.sampling_key()


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def cut_at_eos(new: list[int], eos_token_id: Any) -> tuple[list[int], str]:
    """A row's generated ids up to and including its first end-of-turn id, and the finish reason ("stop" there,
    else "length"): generate keeps writing padding after a row of a batch ends."""
    eos_ids = set(_as_list(eos_token_id))
    for j, token in enumerate(new):
        if token in eos_ids:
            return new[: j + 1], "stop"
    return new, "length"


@contextmanager
def seeded_rng(seed: int | None, device: Any) -> Iterator[None]:
    """`torch.manual_seed(seed)` for one row on `device`, the global RNG state restored afterwards, so a seeded
    sampled row's tokens depend on its seed and prompt only; None seeds nothing (greedy or unseeded rows)."""
    if seed is None:
        yield
        return
    import torch

    device = torch.device(device)
    devices = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
