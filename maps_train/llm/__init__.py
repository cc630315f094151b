"""LLM backends: one batched chat interface (vLLM engine, OpenAI-compatible servers, transformers+PEFT),
per-role routing with LoRA adapters.

Modules: `types` (ChatRequest, Completion), `router` (Router, build_router), `pool` (EnginePool),
`vllm_backend`, `openai_backend`, `hf_backend` (one backend each; heavy imports happen inside them),
`common` (route merging, prompt rendering/fitting, thinking split), `cli` (`maps-train chat`).
"""

from maps_train.llm.router import Router, build_router
from maps_train.llm.types import Backend, ChatRequest, Completion

__all__ = ["Backend", "ChatRequest", "Completion", "Router", "build_router"]
