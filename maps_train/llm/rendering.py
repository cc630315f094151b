"""A `CallSpec` rendered as the model sees it: the chat template, a continued message, or a raw continuation of
the model's own turn, as text and as prompt tokens."""

from __future__ import annotations

from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.call_spec import CallSpec
from maps_train.llm.thinking import THINK_OPEN, prompt_opens_thinking


def render_prompt(tokenizer: Any, spec: CallSpec) -> str:
    """The chat template applied the way vLLM's chat entry point does it (text, then tokenised without
    special tokens), so HF and vLLM see the same prompt tokens for the same request. A raw continuation is
    appended after the rendered generation prompt (see `ChatRequest.raw_continuation`)."""
    request = spec.request
    raw = request.raw_continuation
    if raw is not None and request.continue_final_message:
        raise MapsTrainError(
            f"role '{request.role}': a request continues either its last message (continue_final_message) or a "
            "raw turn (raw_continuation), not both"
        )
    cont = request.continue_final_message
    prompt = tokenizer.apply_chat_template(
        request.messages,
        tokenize=False,
        add_generation_prompt=not cont,
        continue_final_message=cont,
        **spec.chat_template_kwargs,
    )
    return prompt if raw is None else prompt + join_continuation(prompt, raw)


def join_continuation(prompt: str, raw: str) -> str:
    """`raw` as it follows `prompt`: a turn written with its own `<think>` loses that tag where the template
    already opened the block (Qwen3.6, QwQ), so the same turn text continues correctly under either template."""
    if prompt_opens_thinking(prompt) and raw.lstrip().startswith(THINK_OPEN):
        return raw.lstrip()[len(THINK_OPEN) :].lstrip("\n")
    return raw


def prompt_token_ids(tokenizer: Any, spec: CallSpec) -> list[int]:
    text = render_prompt(tokenizer, spec)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
