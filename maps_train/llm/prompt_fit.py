"""A prompt fitted to the context: rendered, and when it leaves no room for `max_tokens`, shrunk (the request's own
shrinker, then a continued turn's oldest paragraphs, then middles) with every think block kept whole."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.call_spec import CallSpec
from maps_train.llm.rendering import render_prompt
from maps_train.llm.thinking import THINK_CLOSE, THINK_OPEN, inside_at, starts_inside_thinking
from maps_train.llm.types import ChatRequest

CUT_MARK = "\n[... left out to fit the context ...]\n"
_TAG_SNAP = 10  # a cut that would split a tag like `</think>` moves this far at most to leave it whole


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
    before, after = inside_at(text, start, opened), inside_at(text, end, opened)
    mark = CUT_MARK
    if before and not after:
        mark += f"{THINK_CLOSE}\n\n"
    elif after and not before:
        mark += f"{THINK_OPEN}\n"
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
        before, after = inside_at(head, len(head), opened), inside_at(upto, len(upto), opened)
        if before and not after:
            mark += f"{THINK_CLOSE}\n\n"
        elif after and not before:
            mark += f"{THINK_OPEN}\n"
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
