"""LLM backends: one batched chat interface (vLLM engine, OpenAI-compatible servers, transformers+PEFT),
per-role routing with LoRA adapters, and the cost ledger every call is written to.

Modules: `types` (ChatRequest, Completion), `router` (Router, build_router), `ledger` (CostLedger),
`vllm_backend`, `openai_backend`, `hf_backend` (one backend each; heavy imports happen inside them),
`common` (route merging, prompt rendering/fitting, thinking split), `cli` (`maps-train chat`).
"""

from maps_train.llm.ledger import CostLedger
from maps_train.llm.router import Router, build_router
from maps_train.llm.types import Backend, ChatRequest, Completion

__all__ = ["Backend", "ChatRequest", "Completion", "CostLedger", "Router", "build_router"]
