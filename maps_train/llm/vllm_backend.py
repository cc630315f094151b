"""vLLM offline-engine backend: one `vllm.LLM` per base model, one `LoRARequest` per role adapter.

Prompts are rendered with the tokenizer's chat template here (per-request `chat_template_kwargs`, which
`LLM.chat` only takes per call) and passed as token ids, so a whole mixed batch (different roles, adapters,
sampling, schemas) is ONE `LLM.generate` call with per-prompt `SamplingParams` and `lora_request` lists.
JSON schemas become `StructuredOutputsParams(json=...)`. Temperature, top_p and seed are per request (the route's,
overridden by the request's): vLLM draws each seeded request from its own generator, so a seed reproduces a
request's text whatever else is in the batch (up to batch-dependent float rounding in the logits). The engine starts on first use; `close()` frees it and
a later call starts it again.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from maps_train.llm.common import (
    CallSpec,
    adapter_dir,
    adapter_name,
    call_spec,
    default_route,
    fit_prompt,
    prompt_token_ids,
    split_thinking,
)
from maps_train.llm.types import ChatRequest, Completion
from maps_train.platform import apply_runtime_defaults, lora_slots, vllm_on_cpu
from maps_train.recipe import BackendConfig, RoleRoute


class VLLMBackend:
    kind = "vllm"

    def __init__(
        self,
        model: str,
        config: BackendConfig | None = None,
        max_loras: int = 0,
        enable_lora: bool | None = None,
        adapters: list[str] | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ):
        """`max_loras`: distinct adapters this engine serves (at least 1 when LoRA is on); `adapters`: folders to
        check now (others are checked when first requested); `engine_kwargs` go to `vllm.LLM` unchanged."""
        from maps_train.models import resolve_model

        self.config = config or BackendConfig()
        self.model_name = model
        self.path = resolve_model(model)
        self.enable_lora = bool(max_loras) if enable_lora is None else enable_lora
        self.max_loras = max(1, max_loras)
        self.engine_kwargs = engine_kwargs or {}
        self._llm = None
        self._tokenizer = None
        self._loras: dict[str, Any] = {}  # adapter folder -> LoRARequest
        for path in adapters or []:
            adapter_dir(path, "?")

    # -- engine ---------------------------------------------------------------------------------------------

    @property
    def llm(self):
        if self._llm is None:
            self._llm = self._start()
        return self._llm

    def _start(self):
        from vllm import LLM

        cfg = self.config
        cpu = vllm_on_cpu()
        if cpu:
            apply_runtime_defaults(kv_cache_gib=cfg.cpu_kv_cache_gib)
        kwargs: dict[str, Any] = {
            "model": self.path,
            "dtype": ("float32" if cpu else "auto") if cfg.dtype == "auto" else cfg.dtype,
            "max_model_len": cfg.max_model_len,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "enforce_eager": cfg.enforce_eager or cpu,
        }
        if not cpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if cfg.structured_disable_whitespace:
            kwargs["structured_outputs_config"] = {"backend": "xgrammar", "disable_any_whitespace": True}
        if self.enable_lora:
            kwargs.update(enable_lora=True, max_loras=lora_slots(self.max_loras, cpu), max_lora_rank=cfg.max_lora_rank)
        kwargs.update(self.engine_kwargs)
        llm = LLM(**kwargs)
        self._tokenizer = llm.get_tokenizer()
        return llm

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
    def sampling_params(spec: CallSpec):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(json=spec.json_schema) if spec.json_schema is not None else None
        return SamplingParams(
            max_tokens=spec.max_tokens,
            temperature=spec.temperature,
            top_p=spec.top_p,
            stop=spec.stop,
            seed=spec.seed,
            structured_outputs=structured,
        )

    def generate(self, requests: list[ChatRequest], routes: list[RoleRoute] | None = None) -> list[Completion]:
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        routes = routes or [default_route(self.model_name)] * len(requests)
        specs = [call_spec(req, route) for req, route in zip(requests, routes)]
        loras = [self.lora_request(s.adapter, s.request.role) if s.adapter else None for s in specs]
        llm, tok = self.llm, self.tokenizer
        prompts = [
            TokensPrompt(
                prompt_token_ids=fit_prompt(
                    prompt_token_ids(tok, s), s, self.config.max_model_len, self.config.truncate_prompt
                )
            )
            for s in specs
        ]
        params = [self.sampling_params(s) for s in specs]
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, lora_request=loras, use_tqdm=len(prompts) >= 256)
        latency = time.perf_counter() - start
        completions = []
        for spec, lora, out in zip(specs, loras, outputs):
            sample = out.outputs[0]
            text, reasoning = split_thinking(sample.text)
            completions.append(
                Completion(
                    text=text,
                    reasoning=reasoning,
                    prompt_tokens=len(out.prompt_token_ids or []),
                    completion_tokens=len(sample.token_ids),
                    latency_s=latency,
                    model=self.model_name,
                    adapter=lora.lora_name if lora is not None else None,
                    finish_reason=sample.finish_reason,
                    role=spec.request.role,
                    constrained=spec.json_schema is not None,
                    **spec.sampling_used(),
                )
            )
        return completions

    def close(self) -> None:
        """Shut the engine down (its worker process exits); a later call starts a fresh one."""
        if self._llm is None:
            return
        llm, self._llm, self._tokenizer = self._llm, None, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)  # the client of the worker process
        shutdown = getattr(core, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:  # noqa: BLE001, S110 - best effort: the engine may already be gone
                pass
        del llm
        gc.collect()
