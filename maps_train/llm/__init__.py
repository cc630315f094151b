"""LLM backends: one batched chat interface (vLLM engine, OpenAI-compatible servers, transformers+PEFT),
per-role routing with LoRA adapters, and the cost ledger every call is written to."""

from maps_train.llm.types import Backend, ChatRequest, Completion

__all__ = ["Backend", "ChatRequest", "Completion"]
