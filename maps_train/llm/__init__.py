"""LLM backends: one batched chat interface (vLLM engine, OpenAI-compatible servers, transformers+PEFT),
per-role routing with LoRA adapters.

Modules: `types` (ChatRequest, Completion), `router` (Router, build_router), `pool` (EnginePool),
`vllm_backend`, `openai_backend`, `hf_backend` (one backend each; heavy imports happen inside them),
`call_spec` (a request merged with its route), `rendering` (prompts as the model sees them), `prompt_fit`
(fitting and shrinking a prompt to the context), `thinking` (think tags: split, count, decode), `adapter_folders`,
`vllm_internals` (every access past vLLM's public API), `cli` (`maps-train chat`).
"""

from maps_train.llm.router import Router, build_router
from maps_train.llm.types import Backend, ChatRequest, Completion

__all__ = ["Backend", "ChatRequest", "Completion", "Router", "build_router"]
