"""Qwen3's think tags: whether a prompt opens or closes the reply's think block, splitting the generated text
into answer and reasoning, counting the tokens spent thinking, and decoding so that `<think>`/`</think>` stay."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from maps_train.llm.call_spec import CallSpec


THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether generation after `prompt` starts inside a think block.

    Only the end of the prompt decides: a template that opens thinking for the reply ends with `<think>`; a raw
    continuation is inside a block when its last `<think>` is not closed. Earlier tags (a prompt that mentions
    `<think>` in its instructions, past turns) do not count."""
    stripped = prompt.rstrip()
    if stripped.endswith(THINK_OPEN):
        return True
    tail = _after_last_turn(stripped)
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


def prompt_closes_thinking(prompt: str) -> bool:
    """Whether the reply's think block is already closed at the end of `prompt` (Qwen3's thinking-off generation
    prompt `<think>\n\n</think>\n\n`, or a raw continuation past its reasoning): generation is the answer."""
    tail = _after_last_turn(prompt.rstrip())
    return tail.rfind(THINK_CLOSE) > tail.rfind(THINK_OPEN)


def _after_last_turn(prompt: str) -> str:
    """The text after the last turn opener of a ChatML prompt (`<|im_start|>`); all of it for other formats."""
    start = prompt.rfind("<|im_start|>")
    return prompt[start:] if start >= 0 else prompt


def generation_opens_thinking(prompt: str, spec: CallSpec) -> bool:
    """`prompt_opens_thinking` for what this request generates after: a continued chat message is read as the
    model's visible text, so it never does. (The agents continue their turns as raw continuations, which this
    reads from the prompt: a Qwen3 template rewrites a continued message that holds reasoning blocks.)"""
    return not spec.request.continue_final_message and prompt_opens_thinking(prompt)


def starts_inside_thinking(text: str) -> bool:
    """Whether `text` begins inside a think block opened before it: its first think tag is a `</think>`."""
    close = text.find(THINK_CLOSE)
    opener = text.find(THINK_OPEN)
    return close >= 0 and (opener < 0 or close < opener)


def inside_at(text: str, pos: int, opened: bool) -> bool:
    """Whether `text[pos]` lies inside a think block (`opened`: the text begins inside one)."""
    head = text[:pos]
    opener, close = head.rfind(THINK_OPEN), head.rfind(THINK_CLOSE)
    return opened if opener < 0 and close < 0 else opener > close


def split_thinking(text: str, opened: bool = False) -> tuple[str, str | None]:
    """(answer, reasoning): Qwen3 writes `<think>...</think>` before its answer.

    `opened`: the prompt already opened the block (see `prompt_opens_thinking`), so the text starts as reasoning
    with no opening tag, and without a `</think>` it is all reasoning (cut off at max_tokens, or stopped at a stop
    string inside the block). Otherwise a lone `</think>` also ends reasoning; an unclosed `<think>` is all
    reasoning and no answer.
    """
    if THINK_CLOSE in text:
        head, _, tail = text.partition(THINK_CLOSE)
        reasoning = head.split(THINK_OPEN, 1)[-1].strip()
        return tail.strip(), reasoning
    stripped = text.lstrip()
    if opened:
        return "", stripped.removeprefix(THINK_OPEN).strip()
    if stripped.startswith(THINK_OPEN):
        return "", stripped[len(THINK_OPEN) :].strip()
    return text, None


def reasoning_token_count(token_ids: list[int], tokenizer: Any, answer: str, reasoning: str | None) -> int:
    """How many of the generated `token_ids` were thinking: up to and including the first `</think>` token, all
    of them when no answer followed (the block never closed). A tokenizer without a `</think>` token (the tag
    written as text) is counted by encoding the reasoning."""
    if reasoning is None:
        return 0
    close_id = think_close_id(tokenizer)
    if close_id is not None and close_id in token_ids:
        return token_ids.index(close_id) + 1
    if not answer:
        return len(token_ids)
    encoded = tokenizer(f"{THINK_OPEN}{reasoning}{THINK_CLOSE}", add_special_tokens=False)["input_ids"]
    return min(len(token_ids), len(encoded))


def think_tags_special(tokenizer: Any) -> bool:
    """Whether the tokenizer marks `<think>`/`</think>` as special tokens: decoding with special tokens skipped (the
    transformers and vLLM default) would then drop them, and every answer would read as reasoning. Qwen3's
    tokenizer_config.json marks them `"special": false`; a model whose tokenizer marks them special is decoded
    keeping them (`decode_generated`, vLLM's `skip_special_tokens=False`)."""
    return bool(_think_ids(tokenizer) & _special_ids(tokenizer))


def _think_ids(tokenizer: Any) -> set[int]:
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = tokenizer.convert_tokens_to_ids([THINK_OPEN, THINK_CLOSE])
    return {i for i in ids if i is not None and i != unknown}


def _special_ids(tokenizer: Any) -> set[int]:
    """Every id a decode with `skip_special_tokens=True` leaves out: the named special tokens and every added token
    flagged special."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return set(getattr(tokenizer, "all_special_ids", []) or []) | {i for i, t in added.items() if t.special}


def decode_generated(tokenizer: Any, token_ids: list[int]) -> str:
    """Generated ids as text: special tokens left out, except `<think>` and `</think>` whatever their flag."""
    if not think_tags_special(tokenizer):
        return tokenizer.decode(token_ids, skip_special_tokens=True)
    dropped = _special_ids(tokenizer) - _think_ids(tokenizer)
    return tokenizer.decode([i for i in token_ids if i not in dropped], skip_special_tokens=False)


def think_close_id(tokenizer: Any) -> int | None:
    """The id of `</think>` when the vocabulary holds it as one token (the Qwen3 family), else None."""
    ids = tokenizer.convert_tokens_to_ids([THINK_CLOSE])
    unknown = getattr(tokenizer, "unk_token_id", None)
    return ids[0] if ids and ids[0] is not None and ids[0] != unknown else None


def model_can_think(path: str) -> bool:
    """Whether a model folder's (or hub id's) tokenizer has a `</think>` token; True when it cannot be read here
    (a hub id not cached: the paper's models are Qwen3), so a reasoning parser is not silently left out."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return True
    return think_close_id(tokenizer) is not None


def estimated_reasoning_tokens(completion_tokens: int, answer: str, reasoning: str | None) -> int:
    """Reasoning tokens when nothing counted them (a server without a reasoning parser and no local tokenizer):
    the completion's tokens shared in proportion to the characters of reasoning and answer."""
    if not reasoning:
        return 0
    if not answer:
        return completion_tokens
    return round(completion_tokens * len(reasoning) / (len(reasoning) + len(answer)))


def ends_inside_thinking(generated: str, reasoning: str | None) -> bool:
    """Whether a generation ends inside an unclosed think block. `reasoning` is the backend's split: not None when
    the generation thought; a generation whose text has no `<think>` before its first `</think>` (or none at all)
    began inside a block the prompt opened (Qwen3.6's generation prompt, a turn continued inside its reasoning)."""
    if reasoning is None:
        return False
    first_close = generated.find(THINK_CLOSE)
    opened = THINK_OPEN not in (generated if first_close < 0 else generated[:first_close])
    text = (THINK_OPEN if opened else "") + generated
    return text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE)
