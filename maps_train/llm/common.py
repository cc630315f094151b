"""What every backend shares: a request merged with its role's route, prompt rendering (chat template, chat
continuation, or raw continuation of the model's own turn) and fitting, splitting Qwen3 thinking out of the
generated text, and counting the tokens spent thinking."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.types import ChatRequest
from maps_train.recipe import RoleRoute

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


@dataclass
class CallSpec:
    """One request as a backend runs it: the route's sampling with the request's overrides applied.

    Sampling travels on the request (temperature, top_p, seed), not on the route, so one engine serves greedy
    evaluation and sampled teacher runs alike and each request can carry its own seed. top_k, min_p and the
    penalties are the route's, sent to every backend in full (see `RoleRoute`)."""

    request: ChatRequest
    route: RoleRoute
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str] | None
    seed: int | None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    json_schema: dict[str, Any] | None = None  # only when the route asks for structured output
    # The route's, resolved to the value every backend is sent (0: no top-k; 0; 0; 1: no penalty).
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0

    @property
    def adapter(self) -> str | None:
        return self.route.adapter

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def sampling_key(self) -> tuple:
        """Requests with equal keys can share one `generate` call of a backend with per-call sampling (HF).

        Greedy decoding ignores top_p, top_k, min_p and the seed (not the penalties), so greedy rows share a key
        whatever those say."""
        penalties = (self.presence_penalty, self.repetition_penalty)
        if self.greedy:
            return (self.max_tokens, 0.0, tuple(self.stop or ()), *penalties)
        return (self.max_tokens, self.temperature, self.top_p, tuple(self.stop or ()), self.seed, self.top_k,
                self.min_p, *penalties)

    def sampling_used(self) -> dict[str, Any]:
        """The sampling fields a `Completion` reports (what the backend ran, not what the route said)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}


def _override(value: Any, default: Any) -> Any:
    """A request's field wins over the route's unless it is None (0 and 0.0 are real values)."""
    return value if value is not None else default


def call_spec(request: ChatRequest, route: RoleRoute) -> CallSpec:
    kwargs = {"enable_thinking": route.enable_thinking}
    kwargs.update(request.chat_template_kwargs or {})
    return CallSpec(
        request=request,
        route=route,
        max_tokens=_override(request.max_tokens, route.max_tokens),
        temperature=_override(request.temperature, route.temperature),
        top_p=_override(request.top_p, route.top_p),
        stop=request.stop,
        seed=_override(request.seed, route.seed),
        chat_template_kwargs=kwargs,
        json_schema=request.json_schema if route.structured else None,
        top_k=max(0, route.top_k or 0),
        min_p=route.min_p or 0.0,
        presence_penalty=route.presence_penalty or 0.0,
        repetition_penalty=1.0 if route.repetition_penalty is None else route.repetition_penalty,
    )


def default_route(model: str = "", adapter: str | None = None) -> RoleRoute:
    """The route a backend uses when called directly (without a router): base model, greedy, no thinking."""
    return RoleRoute(model=model, adapter=adapter)


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
    if prompt_opens_thinking(prompt) and raw.lstrip().startswith(_THINK_OPEN):
        return raw.lstrip()[len(_THINK_OPEN) :].lstrip("\n")
    return raw


def prompt_opens_thinking(prompt: str) -> bool:
    """Whether generation after `prompt` starts inside a think block.

    Only the end of the prompt decides: a template that opens thinking for the reply ends with `<think>`; a raw
    continuation is inside a block when its last `<think>` is not closed. Earlier tags (a prompt that mentions
    `<think>` in its instructions, past turns) do not count."""
    stripped = prompt.rstrip()
    if stripped.endswith(_THINK_OPEN):
        return True
    tail = _after_last_turn(stripped)
    return tail.rfind(_THINK_OPEN) > tail.rfind(_THINK_CLOSE)


def prompt_closes_thinking(prompt: str) -> bool:
    """Whether the reply's think block is already closed at the end of `prompt` (Qwen3's thinking-off generation
    prompt `<think>\n\n</think>\n\n`, or a raw continuation past its reasoning): generation is the answer."""
    tail = _after_last_turn(prompt.rstrip())
    return tail.rfind(_THINK_CLOSE) > tail.rfind(_THINK_OPEN)


def _after_last_turn(prompt: str) -> str:
    """The text after the last turn opener of a ChatML prompt (`<|im_start|>`); all of it for other formats."""
    start = prompt.rfind("<|im_start|>")
    return prompt[start:] if start >= 0 else prompt


def generation_opens_thinking(prompt: str, spec: CallSpec) -> bool:
    """`prompt_opens_thinking` for what this request generates after: a continued chat message is read as the
    model's visible text, so it never does. (The agents continue their turns as raw continuations, which this
    reads from the prompt: a Qwen3 template rewrites a continued message that holds reasoning blocks.)"""
    return not spec.request.continue_final_message and prompt_opens_thinking(prompt)


def prompt_token_ids(tokenizer: Any, spec: CallSpec) -> list[int]:
    text = render_prompt(tokenizer, spec)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


CUT_MARK = "\n[... left out to fit the context ...]\n"
_TAG_SNAP = 10  # a cut that would split a tag like `</think>` moves this far at most to leave it whole


def starts_inside_thinking(text: str) -> bool:
    """Whether `text` begins inside a think block opened before it: its first think tag is a `</think>`."""
    close = text.find(_THINK_CLOSE)
    opener = text.find(_THINK_OPEN)
    return close >= 0 and (opener < 0 or close < opener)


def _inside_at(text: str, pos: int, opened: bool) -> bool:
    head = text[:pos]
    opener, close = head.rfind(_THINK_OPEN), head.rfind(_THINK_CLOSE)
    return opened if opener < 0 and close < 0 else opener > close


def cut_span(text: str, start: int, end: int, opened: bool | None = None) -> str:
    """`text` with `text[start:end]` replaced by `CUT_MARK`, every think block kept as it was: a block open where
    the cut starts and closed inside it is closed after the mark; one opened inside it and still open where it
    ends is opened again. A cut never splits a tag. `opened`: the text begins inside a block (default: read from
    the text, whose first think tag is then a `</think>`)."""
    if start >= end:
        return text
    opened = starts_inside_thinking(text) if opened is None else opened
    lt = text.rfind("<", max(0, start - _TAG_SNAP), start)
    if lt >= 0 and text.rfind(">", lt, start) < 0:
        start = lt
    gt = text.find(">", end, end + _TAG_SNAP)
    if gt >= 0 and text.find("<", end, gt) < 0 and text.rfind("<", max(0, end - _TAG_SNAP), end) > text.rfind(">", 0, end):
        end = gt + 1
    before, after = _inside_at(text, start, opened), _inside_at(text, end, opened)
    mark = CUT_MARK
    if before and not after:
        mark += f"{_THINK_CLOSE}\n\n"
    elif after and not before:
        mark += f"{_THINK_OPEN}\n"
    return text[:start] + mark + text[end:]


@dataclass
class FittedPrompt:
    """A request as the model will see it: rendered, tokenised, shrunk when it did not fit the context."""

    spec: CallSpec  # the request after shrinking (the original one when it fitted)
    text: str  # the rendered prompt (for `left`, before its oldest tokens were cut)
    ids: list[int]  # the prompt tokens that go to the model
    dropped: int = 0  # prompt tokens left out: the rendered original's count minus `ids`'
    shrunk: bool = False  # `spec` is a smaller request than the one asked for

    def completion_fields(self) -> dict[str, Any]:
        """What a `Completion` reports about fitting: tokens dropped and, when the prompt was shrunk, the
        messages (and raw continuation) the model saw, so the trace and SFT rows hold the seen prompt."""
        if not self.shrunk:
            return {"prompt_tokens_dropped": self.dropped}
        shrunk = self.spec.request
        return {
            "prompt_tokens_dropped": self.dropped,
            "fitted_messages": shrunk.messages,
            "fitted_continuation": shrunk.raw_continuation,
        }


def prompt_room(spec: CallSpec, max_model_len: int) -> int:
    """Tokens a prompt may take: the context minus the request's `max_tokens`; a one-line error when none."""
    room = max_model_len - spec.max_tokens
    if room <= 0:
        raise MapsTrainError(
            f"roles.{spec.request.role}.max_tokens: {spec.max_tokens} leaves no room for a prompt within "
            f"backend.max_model_len={max_model_len}"
        )
    return room


def fit_request(tokenizer: Any, spec: CallSpec, max_model_len: int, policy: str) -> FittedPrompt:
    """Render `spec` and make room for `max_tokens` of output within the context.

    policy "shrink" (the default): shrink what is least needed, in this order, each stage only when the one
    before could not go far enough: the request's own `shrink` (the agent's pieces: oldest observations and
    turns, lowest-ranked passages, the middle of long evidence), then a continued turn's oldest paragraphs (its
    first one and its newest text stay), then the middle of that turn, then the middle of the longest user
    message (its head, the question, and its tail, the instructions, stay). The system prompt is never cut; a
    prompt that still does not fit is a one-line error. "error": a one-line error for any prompt over the room.
    "left": keep only the newest tokens (the system prompt and the question go first; the call goes through)."""
    room = prompt_room(spec, max_model_len)
    text, ids = _render_ids(tokenizer, spec)
    if len(ids) <= room:
        return FittedPrompt(spec, text, ids)
    if policy == "left":
        return FittedPrompt(spec, text, ids[len(ids) - room :], len(ids) - room)
    if policy != "shrink":
        raise MapsTrainError(
            f"backend.truncate_prompt={policy}: prompt of role '{spec.request.role}' (question "
            f"{spec.request.question_id}) has {len(ids)} tokens, over max_model_len {max_model_len} minus "
            f"max_tokens {spec.max_tokens}"
        )
    current = spec
    for stage in (_own_shrinker, _continuation_pieces, _continuation_middle, _user_middle):
        shrinker = stage(current.request, tokenizer)
        if shrinker is None or shrinker.steps <= 0:
            continue
        fitted = _smallest_fitting_step(tokenizer, current, shrinker, room)
        if fitted is not None:
            fitted.dropped, fitted.shrunk = len(ids) - len(fitted.ids), True
            return fitted
        current = _with_request(current, shrinker.apply(current.request, shrinker.steps))
    _, left = _render_ids(tokenizer, current)
    raise MapsTrainError(
        f"backend.max_model_len={max_model_len}: prompt of role '{spec.request.role}' (question "
        f"{spec.request.question_id}) has {len(left)} tokens even with everything shrinkable left out, over "
        f"{room} (max_model_len minus max_tokens {spec.max_tokens}); raise max_model_len or shorten the system prompt"
    )


def _render_ids(tokenizer: Any, spec: CallSpec) -> tuple[str, list[int]]:
    text = render_prompt(tokenizer, spec)
    return text, list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _with_request(spec: CallSpec, request: ChatRequest) -> CallSpec:
    return replace(spec, request=request)


def _smallest_fitting_step(tokenizer: Any, spec: CallSpec, shrinker: Any, room: int) -> FittedPrompt | None:
    """Binary search for the least shrinking that fits (tokens do not grow with the step); None when even the
    largest step does not fit. About log2(steps) renders, however many pieces there are."""
    best: FittedPrompt | None = None
    low, high = 1, shrinker.steps
    while low <= high:
        middle = (low + high) // 2
        candidate = _with_request(spec, shrinker.apply(spec.request, middle))
        text, ids = _render_ids(tokenizer, candidate)
        if len(ids) <= room:
            best, high = FittedPrompt(candidate, text, ids), middle - 1
        else:
            low = middle + 1
    return best


def _own_shrinker(request: ChatRequest, tokenizer: Any) -> Any:
    return request.shrink


def _continued_text(request: ChatRequest) -> str | None:
    """The turn the model continues: the raw continuation, or the partial last message it goes on writing."""
    if request.raw_continuation is not None:
        return request.raw_continuation
    if request.continue_final_message and request.messages:
        return request.messages[-1]["content"]
    return None


def _with_continued_text(request: ChatRequest, text: str) -> ChatRequest:
    if request.raw_continuation is not None:
        return replace(request, raw_continuation=text, shrink=None)
    last = {**request.messages[-1], "content": text}
    return replace(request, messages=[*request.messages[:-1], last], shrink=None)


@dataclass
class _ContinuationPieces:
    """A continued turn without its oldest paragraphs: step k leaves out paragraphs 2..k+1; the first one, which
    opens the turn, and the newest one with text in it (a turn ending in a blank line keeps the paragraph before
    it) stay, and every think block stays as it was (`cut_span`). Search results spliced into the turn are
    paragraphs of their own."""

    text: str

    @property
    def paragraphs(self) -> list[str]:
        return self.text.split("\n\n")

    @property
    def steps(self) -> int:
        paragraphs = self.paragraphs
        newest = max((i for i, p in enumerate(paragraphs) if p.strip()), default=0)
        return max(0, newest - 1)

    def apply(self, request: ChatRequest, step: int) -> ChatRequest:
        if step <= 0:
            return request
        paragraphs = self.paragraphs
        start = len(paragraphs[0]) + 2
        end = start + len("\n\n".join(paragraphs[1 : 1 + step]))
        return _with_continued_text(request, cut_span(self.text, start, end))


def _continuation_pieces(request: ChatRequest, tokenizer: Any) -> _ContinuationPieces | None:
    text = _continued_text(request)
    return None if text is None else _ContinuationPieces(text)


@dataclass
class _MiddleCut:
    """One text without `step` tokens from its middle: the head and the tail stay, split evenly."""

    ids: list[int]
    tokenizer: Any
    rebuild: Any  # (request, shorter text) -> request

    @property
    def steps(self) -> int:
        return max(0, len(self.ids) - 2)

    def apply(self, request: ChatRequest, step: int) -> ChatRequest:
        """Every think block stays as it was (see `cut_span`)."""
        if step <= 0:
            return request
        kept = len(self.ids) - step
        cut_at, resume_at = (kept + 1) // 2, len(self.ids) - kept // 2
        decode = self.tokenizer.decode
        full = decode(self.ids)
        opened = starts_inside_thinking(full)
        head, upto = decode(self.ids[:cut_at]), decode(self.ids[:resume_at])
        mark = CUT_MARK
        before, after = _inside_at(head, len(head), opened), _inside_at(upto, len(upto), opened)
        if before and not after:
            mark += f"{_THINK_CLOSE}\n\n"
        elif after and not before:
            mark += f"{_THINK_OPEN}\n"
        return self.rebuild(request, head + mark + decode(self.ids[resume_at:]))


def middle_cut(tokenizer: Any, text: str, rebuild: Any) -> _MiddleCut:
    return _MiddleCut(list(tokenizer(text, add_special_tokens=False)["input_ids"]), tokenizer, rebuild)


def _continuation_middle(request: ChatRequest, tokenizer: Any) -> _MiddleCut | None:
    text = _continued_text(request)
    return None if text is None else middle_cut(tokenizer, text, _with_continued_text)


def _user_middle(request: ChatRequest, tokenizer: Any) -> _MiddleCut | None:
    """The middle of the longest user message (a continued last message is the turn, handled before)."""
    users = [i for i, m in enumerate(request.messages) if m.get("role") == "user"]
    if not users:
        return None
    index = max(users, key=lambda i: len(request.messages[i]["content"]))

    def rebuild(req: ChatRequest, text: str) -> ChatRequest:
        messages = list(req.messages)
        messages[index] = {**messages[index], "content": text}
        return replace(req, messages=messages, shrink=None)

    return middle_cut(tokenizer, request.messages[index]["content"], rebuild)


def split_thinking(text: str, opened: bool = False) -> tuple[str, str | None]:
    """(answer, reasoning): Qwen3 writes `<think>...</think>` before its answer.

    `opened`: the prompt already opened the block (see `prompt_opens_thinking`), so the text starts as reasoning
    with no opening tag, and without a `</think>` it is all reasoning (cut off at max_tokens, or stopped at a stop
    string inside the block). Otherwise a lone `</think>` also ends reasoning; an unclosed `<think>` is all
    reasoning and no answer.
    """
    if _THINK_CLOSE in text:
        head, _, tail = text.partition(_THINK_CLOSE)
        reasoning = head.split(_THINK_OPEN, 1)[-1].strip()
        return tail.strip(), reasoning
    stripped = text.lstrip()
    if opened:
        return "", stripped.removeprefix(_THINK_OPEN).strip()
    if stripped.startswith(_THINK_OPEN):
        return "", stripped[len(_THINK_OPEN) :].strip()
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
    encoded = tokenizer(f"{_THINK_OPEN}{reasoning}{_THINK_CLOSE}", add_special_tokens=False)["input_ids"]
    return min(len(token_ids), len(encoded))


def think_tags_special(tokenizer: Any) -> bool:
    """Whether the tokenizer marks `<think>`/`</think>` as special tokens: decoding with special tokens skipped (the
    transformers and vLLM default) would then drop them, and every answer would read as reasoning. Qwen3's
    tokenizer_config.json marks them `"special": false`; a model whose tokenizer marks them special is decoded
    keeping them (`decode_generated`, vLLM's `skip_special_tokens=False`)."""
    return bool(_think_ids(tokenizer) & _special_ids(tokenizer))


def _think_ids(tokenizer: Any) -> set[int]:
    unknown = getattr(tokenizer, "unk_token_id", None)
    ids = tokenizer.convert_tokens_to_ids([_THINK_OPEN, _THINK_CLOSE])
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
    ids = tokenizer.convert_tokens_to_ids([_THINK_CLOSE])
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


def cut_at_stop(text: str, stop: list[str] | None) -> tuple[str, bool]:
    """Text up to the first stop string (excluded, as vLLM does), and whether one was found."""
    cut, found = first_stop(text, stop)
    return cut, found is not None


def first_stop(text: str, stop: list[str] | None) -> tuple[str, str | None]:
    """Text up to the first stop string (excluded, as vLLM does), and that stop string (None when none is in it;
    of two starting at the same place, the longer)."""
    found = [(text.find(s), -len(s), s) for s in stop or () if s and s in text]
    if not found:
        return text, None
    at, _, string = min(found)
    return text[:at], string


def ends_inside_thinking(generated: str, reasoning: str | None) -> bool:
    """Whether a generation ends inside an unclosed think block. `reasoning` is the backend's split: not None when
    the generation thought; a generation whose text has no `<think>` before its first `</think>` (or none at all)
    began inside a block the prompt opened (Qwen3.6's generation prompt, a turn continued inside its reasoning)."""
    if reasoning is None:
        return False
    first_close = generated.find(_THINK_CLOSE)
    opened = _THINK_OPEN not in (generated if first_close < 0 else generated[:first_close])
    text = (_THINK_OPEN if opened else "") + generated
    return text.rfind(_THINK_OPEN) > text.rfind(_THINK_CLOSE)


def adapter_dir(path: str, role: str) -> Path:
    """A LoRA adapter folder, checked; the error names the route field."""
    folder = Path(path).expanduser()
    if not (folder / "adapter_config.json").is_file():
        raise MapsTrainError(
            f"roles.{role}.adapter: '{path}' is not a LoRA adapter folder (no adapter_config.json there)"
        )
    return folder


def adapter_name(path: str) -> str:
    """A stable, module-safe name for an adapter folder (PEFT adapter names become module keys: no dots)."""
    base = Path(path.rstrip("/")).name or "adapter"
    return re.sub(r"\W", "_", base)
