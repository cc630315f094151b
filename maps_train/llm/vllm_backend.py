"""vLLM offline-engine backend: one `vllm.LLM` per base model, one `LoRARequest` per role adapter.

Prompts are rendered with the tokenizer's chat template here (per-request `chat_template_kwargs`, which
`LLM.chat` only takes per call) and passed as token ids, so a whole mixed batch (different roles, adapters,
sampling, schemas) is ONE `LLM.generate` call with per-prompt `SamplingParams` and `lora_request` lists.
JSON schemas become `StructuredOutputsParams(json=...)`. Temperature, top_p and seed are per request (the route's,
overridden by the request's), top_k, min_p and the penalties the route's: vLLM draws each seeded request from its own generator, so a seed reproduces a
request's text whatever else is in the batch (up to batch-dependent float rounding in the logits). The engine starts on first use; `close()` frees it and
a later call starts it again.

Calls go through an `EngineLoop` (one thread stepping the engine), or with `backend.vllm_engine: async` through
vLLM's `AsyncLLM` on its own event loop thread (`vllm_async`): `generate` may be called from many threads at
once (the continuous agent schedule does), every call's prompts join the running batch as soon as they arrive,
and each completion's `latency_s` is its own request's time from submission to its last token.

Thinking (Qwen3): an engine serving a route with `enable_thinking` starts with `reasoning_parser="qwen3"` (vLLM
0.32: the `LLM` keyword, copied into `StructuredOutputsConfig.reasoning_parser`), so a JSON grammar applies only
after the model's `</think>`. The gate reads the prompt: one whose generation prompt is already closed (Qwen3's
`<think></think>` when thinking is off) is constrained from its first token. A model without a `</think>` token
(SmolLM2) gets no parser: its prompts never close a block, so the gate would never open and constrained rows
would run free. A raw continuation (`ChatRequest.raw_continuation`) goes in as the rendered prompt plus the text.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.adapter_folders import adapter_dir, adapter_name
from maps_train.llm.call_spec import CallSpec, call_spec, default_route
from maps_train.llm.prompt_fit import fit_request
from maps_train.llm.thinking import (
    generation_opens_thinking,
    model_can_think,
    prompt_closes_thinking,
    reasoning_token_count,
    split_thinking,
    think_close_id,
    think_tags_special,
)
from maps_train.llm.types import ChatRequest, Completion
from maps_train.llm.vllm_internals import shutdown_engine, vllm_kernel_scan_guard
from maps_train.platform import (
    apply_runtime_defaults,
    cpu_scheduler_kwargs,
    lora_slots,
    vllm_dtype,
    vllm_on_cpu,
)
from maps_train.recipe import BackendConfig, RoleRoute


class VLLMBackend:
    kind = "vllm"
    concurrent = True  # generate() may be called from many threads at once (see the module doc)

    def __init__(
        self,
        model: str,
        config: BackendConfig | None = None,
        max_loras: int = 0,
        enable_lora: bool | None = None,
        adapters: list[str] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        thinking: bool = False,
    ):
        """`max_loras`: distinct adapters this engine serves (at least 1 when LoRA is on); `adapters`: folders to
        check now (others are checked when first requested); `engine_kwargs` go to `vllm.LLM` unchanged;
        `thinking`: some route of this engine thinks, so start it with the Qwen3 reasoning parser (when the
        model has a `</think>` token)."""
        from maps_train.models import resolve_model

        self.config = config or BackendConfig()
        self.model_name = model
        self.path = resolve_model(model)
        self.enable_lora = bool(max_loras) if enable_lora is None else enable_lora
        self.max_loras = max(1, max_loras)
        self.engine_kwargs = engine_kwargs or {}
        self.thinking = thinking
        self._started_with_parser = False
        self._can_think: bool | None = None  # the model has a `</think>` token (read once, when it matters)
        self._llm = None
        self._tokenizer = None
        self._loop = None  # the EngineLoop stepping self._llm
        self._lock = threading.RLock()  # engine start, LoRA registry and tokenizer are shared by calling threads
        self._loras: dict[str, Any] = {}  # adapter folder -> LoRARequest
        for path in adapters or []:
            adapter_dir(path, "?")

    # -- engine ---------------------------------------------------------------------------------------------

    @property
    def llm(self):
        with self._lock:
            if self._llm is None:
                self._llm = self._start()
            return self._llm

    @property
    def loop(self):
        """The engine driver generate() submits to (`backend.vllm_engine`): the thread that steps `self.llm`, or
        the `AsyncLLM` driver, which is its own engine."""
        with self._lock:
            engine = self.llm
            if self._loop is None:
                from maps_train.llm.vllm_loop import EngineLoop

                self._loop = EngineLoop(engine)
            return self._loop

    def _start(self):
        """The engine: a `vllm.LLM` ("loop"), or an `AsyncEngineLoop` started from the same keywords ("async")."""
        kwargs = self.llm_kwargs()
        if self.config.vllm_engine == "async":
            from maps_train.llm.vllm_async import AsyncEngineLoop

            with vllm_kernel_scan_guard():
                engine = self._loop = AsyncEngineLoop(kwargs)
        else:
            from vllm import LLM

            with vllm_kernel_scan_guard():  # the core may run in this process (llm.vllm_internals)
                engine = LLM(**kwargs)
        self._tokenizer = engine.get_tokenizer()
        self._started_with_parser = bool(kwargs.get("reasoning_parser"))
        return engine

    def llm_kwargs(self) -> dict[str, Any]:
        """What `vllm.LLM` is started with (the CPU runtime defaults are applied here, before it starts)."""
        cfg = self.config
        cpu = vllm_on_cpu()
        if cpu:
            apply_runtime_defaults(kv_cache_gib=cfg.cpu_kv_cache_gib)
        kwargs: dict[str, Any] = {
            "model": self.path,
            "dtype": vllm_dtype(cfg.dtype, cpu),
            "max_model_len": cfg.max_model_len,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "enforce_eager": cfg.enforce_eager or cpu,
        }
        if not cpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        else:
            kwargs.update(cpu_scheduler_kwargs(cfg.max_model_len))
        if cfg.structured_disable_whitespace:
            kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
        if self.reasoning_parser:
            kwargs["reasoning_parser"] = self.reasoning_parser
        if cfg.language_model_only:
            kwargs["language_model_only"] = True
        if self.enable_lora:
            kwargs.update(enable_lora=True, max_loras=lora_slots(self.max_loras, cpu), max_lora_rank=cfg.max_lora_rank)
        kwargs.update(self.engine_kwargs)
        return kwargs

    @property
    def reasoning_parser(self) -> str | None:
        """The reasoning parser to start with: qwen3 when a route thinks and the model can close a think block
        (has a `</think>` token); None otherwise (see the module doc)."""
        if not self.thinking:
            return None
        if self._can_think is None:
            self._can_think = model_can_think(self.path)
        return "qwen3" if self._can_think else None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            _ = self.llm
        return self._tokenizer

    def lora_request(self, path: str, role: str = "?"):
        """The `LoRARequest` of an adapter folder (ids from 1, names from folder names, made unique)."""
        if path not in self._loras:
            from vllm.lora.request import LoRARequest

            from maps_train.errors import MapsTrainError

            if not self.enable_lora:
                raise MapsTrainError(
                    f"roles.{role}.adapter: the vLLM engine for {self.model_name} was started without LoRA"
                )
            if len(self._loras) >= self.max_loras:
                raise MapsTrainError(
                    f"roles.{role}.adapter: '{path}' would be adapter {len(self._loras) + 1} of an engine started "
                    f"for {self.max_loras} (route every adapter before the engine starts)"
                )
            folder = adapter_dir(path, role)
            name, taken = adapter_name(path), {r.lora_name for r in self._loras.values()}
            if name in taken:
                name = f"{name}_{len(self._loras) + 1}"
            self._loras[path] = LoRARequest(name, len(self._loras) + 1, str(folder))
        return self._loras[path]

    # -- generation -----------------------------------------------------------------------------------------

    @staticmethod
    def sampling_params(spec: CallSpec, keep_think_tags: bool = False):
        """`keep_think_tags`: the tokenizer marks `<think>`/`</think>` special (`think_tags_special`), so the text
        is decoded with special tokens kept, or vLLM would drop them and the answer would read as reasoning."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(json=spec.json_schema) if spec.json_schema is not None else None
        return SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=spec.top_k,
            min_p=spec.min_p,
            presence_penalty=spec.presence_penalty,
            repetition_penalty=spec.repetition_penalty,
            stop=spec.stop,
            seed=spec.seed,
            structured_outputs=structured,
            skip_special_tokens=not keep_think_tags,
        )

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        routes = routes or [default_route(self.model_name)] * len(requests)
        specs = [call_spec(req, route) for req, route in zip(requests, routes)]
        loop = self.loop
        with self._lock:  # one thread at a time renders and tokenises (a fast tokenizer is not re-entrant)
            loras = [self.lora_request(s.adapter, s.request.role) if s.adapter else None for s in specs]
            tok = self.tokenizer
            fitted = [fit_request(tok, s, self.config.max_model_len, self.config.truncate_prompt) for s in specs]
            texts = [f.text for f in fitted]
            self._check_thinking(specs, texts, tok)
            prompts = [TokensPrompt(prompt_token_ids=f.ids) for f in fitted]
            keep = think_tags_special(tok)
        params = [self.sampling_params(s, keep) for s in specs]
        finished = loop.generate(prompts, params, loras)
        completions = []
        with self._lock:
            for spec, lora, done, text, fit in zip(specs, loras, finished, texts, fitted):
                out = done.output
                sample = out.outputs[0]
                token_ids = list(sample.token_ids)
                answer, reasoning = split_thinking(sample.text, generation_opens_thinking(text, spec))
                completions.append(
                    Completion(
                        text=answer,
                        reasoning=reasoning,
                        generated=sample.text,
                        prompt_tokens=len(out.prompt_token_ids or []),
                        completion_tokens=len(token_ids),
                        reasoning_tokens=reasoning_token_count(token_ids, tok, answer, reasoning),
                        latency_s=done.latency_s,
                        model=self.model_name,
                        adapter=lora.lora_name if lora is not None else None,
                        finish_reason=sample.finish_reason,
                        stop_string=sample.stop_reason if isinstance(sample.stop_reason, str) else None,
                        role=spec.request.role,
                        constrained=spec.json_schema is not None,
                        **spec.sampling_used(),
                        **fit.completion_fields(),
                    )
                )
        return completions

    def _check_thinking(self, specs: list[CallSpec], texts: list[str], tokenizer: Any) -> None:
        """Refuse a constrained row whose grammar would not start where it should, instead of running it wrong:
        a thinking row on an engine without the reasoning parser (constrained from its first token: no thinking
        at all), or a non-thinking row on an engine with it whose prompt does not close a think block at its end
        (the gate would wait for a `</think>` that never comes: a template without Qwen3's empty block)."""
        if think_close_id(tokenizer) is None:
            return
        for spec, text in zip(specs, texts):
            if spec.json_schema is None:
                continue
            role, thinking = spec.request.role, spec.chat_template_kwargs.get("enable_thinking")
            if not self._started_with_parser and thinking:
                raise MapsTrainError(
                    f"roles.{role}.enable_thinking: the vLLM engine for {self.model_name} was started without a "
                    "reasoning parser, so its JSON grammar would forbid thinking; route a thinking role to it before "
                    "it starts (the router does), or set roles.<role>.structured=false"
                )
            if self._started_with_parser and not thinking and not prompt_closes_thinking(text):
                raise MapsTrainError(
                    f"roles.{role}: the prompt of {self.model_name} ends without a think block, so with the reasoning "
                    "parser its JSON grammar would never start; use a chat template that writes the empty "
                    "<think></think> block when thinking is off (Qwen3's does)"
                )

    def close(self) -> None:
        """Shut the engine down (its worker process exits; the async driver's close does it all); a later call
        starts a fresh one."""
        if self._llm is None:
            return
        if self._loop is not None:
            self._loop.close()
        llm, self._llm, self._tokenizer, self._loop = self._llm, None, None, None
        shutdown_engine(llm)
        del llm
        gc.collect()
