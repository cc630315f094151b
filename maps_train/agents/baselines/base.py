"""What the baselines share on top of `Engine`: an assistant turn that grows across steps (the model's text and
the spliced tool results in one partial turn, continued each step as raw text after the chat template's
generation prompt), answer-mode prompts, and the "Doc i(Title: t) text" passage format the Search-R1 family
(ParallelSearch, S3) was trained on.

Actions are read only from what the model wrote outside its reasoning (`outside_thinking`): a thinking model
restates the protocol's tags while it reasons ("I should put the query between <search> and </search>"), and a tag
inside `<think>` is not an action. The backend writes past a stop string that fires inside unclosed reasoning
(`maps_train.llm.budget`), so a step ends at a tag written after the reasoning. This departs from the originals,
which read the whole generation (ParallelSearch's and S3's models wrote short `<think>` blocks; Search-o1's QwQ
searched from inside its reasoning); a faithful port searched for "and" and "your query" when Qwen3 restated the
instructions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from maps_train.agents.engine import Engine, QuestionRun
from maps_train.agents.jsonparse import Parsed
from maps_train.agents.maps import resolve_letters
from maps_train.agents.prompt_context import passage_body, truncate_words
from maps_train.errors import MapsTrainError
from maps_train.llm.prompt_fit import CUT_MARK, cut_span
from maps_train.llm.thinking import starts_inside_thinking
from maps_train.llm.types import Backend, ChatRequest, Completion
from maps_train.questions import Question
from maps_train.records.trace import RoleCall
from maps_train.retrieval.base import Hit

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class RawTurnBackend:
    """Sends a continued turn as a raw continuation: a request whose last message is the assistant's partial turn
    goes out as the conversation before it plus that text after the generation prompt (`raw_continuation`), as
    the originals append to a prompt string. A chat template never sees the partial turn, so it cannot rewrite
    it: Qwen3's keeps only an assistant message's first `<think>` block and the text after its last `</think>`
    (transformers then refuses `continue_final_message`), and trailing whitespace of a continued message is
    dropped. The prompt holds the turn byte for byte as the engine keeps it, inside a thinking block too. The
    trace keeps the messages as planned (the partial turn as the last, assistant message)."""

    def __init__(self, inner: Backend):
        self.inner = inner

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return self.inner.generate([self._raw(req) for req in requests])

    @staticmethod
    def _raw(request: ChatRequest) -> ChatRequest:
        messages = request.messages
        if not messages or messages[-1].get("role") != "assistant" or request.raw_continuation is not None:
            return request
        return replace(request, messages=messages[:-1], raw_continuation=messages[-1]["content"])

    def __getattr__(self, name: str):  # ledger, close, concurrent, ... of the wrapped router
        return getattr(self.inner, name)


@dataclass
class Turn:
    """The growing assistant turn of a tool-using baseline: the model's own pieces and the spliced results."""

    text: str = ""  # everything so far, as the model reads it back when it continues
    model_pieces: list[str] = field(default_factory=list)  # only what the model wrote (for answer extraction)
    segments: list[tuple[str, str]] = field(default_factory=list)  # ("model" | "tool", text), in order

    def add_model(self, piece: str) -> None:
        self.text += piece
        self.model_pieces.append(piece)
        self.segments.append(("model", piece))

    def add_tool(self, text: str) -> None:
        self.text += text
        self.segments.append(("tool", text))

    def shrinker(self) -> TurnShrinker | None:
        """How this turn shrinks when the next prompt does not fit the context (None while it is empty)."""
        return TurnShrinker(list(self.segments)) if self.segments else None

    def messages(self, prompt: list[dict[str, str]]) -> list[dict[str, str]]:
        """The prompt, then the partial assistant turn once there is one (sent raw: see `RawTurnBackend`)."""
        if not self.text:
            return list(prompt)
        return [*prompt, {"role": "assistant", "content": self.text}]

    @property
    def model_text(self) -> str:
        return "".join(self.model_pieces)

    @property
    def actions_text(self) -> str:
        """What the model wrote outside its reasoning, in all its pieces (where the final answer is read)."""
        text = self.model_text
        return outside_thinking(text, starts_inside_thinking(text))


class TurnShrinker:
    """A `PromptShrinker` over a baseline's turn (the request's raw continuation): the newest evidence stays.

    The protected part is the last piece the model wrote (its last action), everything after it, and the newest
    results block (a spliced tool text with tags: after the last piece, or before it when the last step took no
    action). Older segments shrink first, oldest first: a model
    piece loses its reasoning (the think tags stay, around a cut mark) and keeps the end of what it wrote outside
    them (its action), a results block keeps its tags around a cut mark; then they are left out together. Then the last piece's reasoning is cut in the
    middle (its action stays), and last the newest results block in the middle (its head and tail stay). Every cut
    keeps each think block as it was (`llm.prompt_fit.cut_span`), so a shrunk turn never holds an unclosed `<think>`
    that the whole turn had closed."""

    CHUNK = 64  # characters one middle-cut step leaves out
    TAIL = 192  # characters an older model piece keeps of what it wrote outside think blocks (its action is last)

    def __init__(self, segments: list[tuple[str, str]]):
        self.segments = segments
        self.text = "".join(text for _, text in segments)
        self.opened = starts_inside_thinking(self.text)
        model = [i for i, (kind, _) in enumerate(segments) if kind == "model"]
        self.last = model[-1] if model else len(segments)
        results = [i for i, (kind, text) in enumerate(segments) if kind == "tool" and "<" in text]
        self.newest = results[-1] if results else None
        self.older = [i for i in range(min(self.last, len(segments))) if i != self.newest]
        self.reasoning_steps = len(self._reasoning(self.last)) // self.CHUNK if self.last < len(segments) else 0
        self.results_steps = len(self._inner(self.newest)) // self.CHUNK if self.newest is not None else 0
        self.steps = len(self.older) + (1 if self.older else 0) + self.reasoning_steps + self.results_steps

    def _reasoning(self, index: int) -> str:
        """What of the last piece may be cut: up to its last `</think>`, or (reasoning written outside think tags)
        all but its last `TAIL` characters, which hold its action."""
        text = self.segments[index][1]
        return text[: text.rfind(THINK_CLOSE)] if THINK_CLOSE in text else text[: max(0, len(text) - self.TAIL)]

    def _inner(self, index: int | None) -> str:
        if index is None:
            return ""
        text = self.segments[index][1]
        start, end = text.find(">") + 1, text.rfind("<")
        return text[start:end] if 0 < start <= end else ""

    def _short(self, index: int) -> str:
        """An older segment as little as it can be: a model piece without its reasoning, a results block
        without its passages; tags stay."""
        kind, text = self.segments[index]
        if kind == "tool":
            start, end = text.find(">") + 1, text.rfind("<")
            return cut_span(text, start, end, opened=False) if 0 < start < end else text
        mark = CUT_MARK.strip("\n")
        out, position, inside = [], 0, self._opened_before(index)
        while position < len(text):
            if inside:
                end = text.find(THINK_CLOSE, position)
                if end < 0:  # the turn goes on inside this block
                    out.append(f"{mark}\n")
                    break
                out.append(f"{mark}\n{THINK_CLOSE}")
                position, inside = end + len(THINK_CLOSE), False
                continue
            start = text.find(THINK_OPEN, position)
            if start < 0:
                out.append(text[position:])
                break
            out.append(text[position : start + len(THINK_OPEN)] + "\n")
            position, inside = start + len(THINK_OPEN), True
        short = "".join(out)
        if len(short) > self.TAIL + self.CHUNK:  # reasoning outside think tags: its tail (the action) stays
            short = cut_span(short, 0, len(short) - self.TAIL, opened=self._opened_before(index))
        return short

    def turn(self, step: int) -> str:
        """The turn after `step` shrinking steps (0: as written)."""
        step = max(0, min(step, self.steps))
        parts = [text for _, text in self.segments]
        for index in self.older[:step]:
            parts[index] = self._short(index)
        step -= min(step, len(self.older))
        shift = 0
        if self.older and step > 0:  # the older segments before the protected ones, left out together
            end = min(self.last, self.newest if self.newest is not None else self.last)  # the first one kept
            if end > 0:
                head = "".join(parts[:end])
                parts = [cut_span(head, 0, len(head), opened=self.opened).lstrip("\n"), *parts[end:]]
                shift = end - 1  # the indices below are of `parts` now
            step -= 1
        if self.reasoning_steps and step > 0:
            taken = min(step, self.reasoning_steps)
            reasoning = self._reasoning(self.last)
            start = max(0, (len(reasoning) - taken * self.CHUNK) // 2)
            parts[self.last - shift] = cut_span(self.segments[self.last][1], start, start + taken * self.CHUNK,
                                                opened=self._opened_before(self.last))
            step -= taken
        if self.results_steps and step > 0:
            inner = self._inner(self.newest)
            text = self.segments[self.newest][1]
            offset = text.find(">") + 1
            drop = min(step, self.results_steps) * self.CHUNK
            start = offset + max(0, (len(inner) - drop) // 2)
            parts[self.newest - shift] = cut_span(text, start, min(start + drop, offset + len(inner)), opened=False)
        return "".join(parts)

    def _opened_before(self, index: int) -> bool:
        before = "".join(text for _, text in self.segments[:index])
        if THINK_OPEN not in before and THINK_CLOSE not in before:
            return self.opened
        return before.rfind(THINK_OPEN) > before.rfind(THINK_CLOSE)

    def apply(self, request: ChatRequest, step: int) -> ChatRequest:
        """`request` with its raw continuation's turn shrunk (what follows the turn, if anything, stays)."""
        raw = request.raw_continuation
        if step <= 0 or raw is None or not raw.startswith(self.text):
            return request
        return replace(request, raw_continuation=self.turn(step) + raw[len(self.text) :], shrink=None)


def outside_thinking(text: str, opened: bool = False) -> str:
    """`text` without its think blocks: what a protocol reads actions from. `opened`: the text begins inside a
    block (the turn ended inside one, or the template opened it). An unclosed block runs to the end; a stray
    `</think>` outside any block is dropped. One pass of `str.find`."""
    kept, position, inside = [], 0, opened
    while position <= len(text):
        if inside:
            end = text.find(THINK_CLOSE, position)
            if end < 0:
                break
            position, inside = end + len(THINK_CLOSE), False
            continue
        start = text.find(THINK_OPEN, position)
        kept.append(text[position : start if start >= 0 else len(text)].replace(THINK_CLOSE, ""))
        if start < 0:
            break
        position, inside = start + len(THINK_OPEN), True
    return "".join(kept)


def actions_text(piece: str, inside: bool) -> str:
    """The part of one step's piece an action may come from: outside its think blocks. `inside`: the turn ended
    inside a block, so the piece begins in it (as it does where its first think tag is a `</think>`: the
    template opened the block)."""
    return outside_thinking(piece, inside or starts_inside_thinking(piece))


def inside_thinking(turn_text: str) -> bool:
    """Whether `turn_text` ends inside an open think block (its last `<think>` is not closed)."""
    return turn_text.rfind(THINK_OPEN) > turn_text.rfind(THINK_CLOSE)


def model_piece(call: RoleCall, inside: bool = False) -> str:
    """What the model wrote in this call, as it goes back into its own turn: the backend's exact generated text
    (`RoleCall.generated`), byte for byte. Where a backend could not give it, it is rebuilt from the split parts:
    a leading `<think>` block went into `reasoning` (Qwen3 thinking, or a Search-R1 model writing
    `<think>...</think>` as plain text) and is put back in Qwen3's own layout (`<think>\\n...\\n</think>\\n\\n`),
    other whitespace around it normalised. An empty answer after the reasoning is a block still open (the stop
    string came inside it). `inside`: the turn already ended inside a think block (the raw continuation resumed
    it), so the reasoning continues that block: no second `<think>`."""
    if call.generated is not None:
        return call.generated
    if call.reasoning is None:
        return call.raw_text
    opener = "" if inside else f"{THINK_OPEN}\n"
    if not call.raw_text:
        return f"{opener}{call.reasoning}"
    return f"{opener}{call.reasoning}\n{THINK_CLOSE}\n\n{call.raw_text}"


def reopen_stop(piece: str, opener: str, closer: str) -> tuple[str, str | None]:
    """Backends drop the stop string (vLLM's default); when `piece` ends inside an `opener ... ` block, put the
    `closer` back (so the history reads as the model wrote it) and return the block's content."""
    start = piece.rfind(opener)
    if start < 0 or closer in piece[start:]:
        return piece, None
    content = piece[start + len(opener) :].strip()
    return piece + closer, content


def search_r1_docs(hits: list[Hit], max_words: int) -> str:
    """Search-R1's passage block (`Doc i(Title: t) text`, one per line), as ParallelSearch and S3 read it."""
    return "".join(
        f"Doc {number}(Title: {hit.title}) {truncate_words(passage_body(hit), max_words)}\n"
        for number, hit in enumerate(hits, start=1)
    )


def parsed_later(_: str) -> Parsed:
    """The plan's parse of a continuing role: the real parse runs on the piece the model wrote, outside its
    reasoning (`actions_text`), after the call; see `BaselineEngine.record_parse`."""
    return Parsed({}, ok=True)


class BaselineEngine(Engine):
    """An `Engine` whose backend continues partial assistant turns raw; answer-mode prompt helpers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = RawTurnBackend(self.backend)
        for name in ("top_k", "max_searches", "max_turns"):
            if getattr(self.agent, name) < 1:
                raise MapsTrainError(f"agent.{name}: must be at least 1, got {getattr(self.agent, name)}")

    @staticmethod
    def record_parse(run: QuestionRun, call: RoleCall, parsed: Parsed) -> Parsed:
        """Put a parse of the whole turn piece on the call and count its failure, as `call_roles` does for a
        parse of the completion text."""
        call.parsed, call.parse_ok, call.parse_error = parsed.value, parsed.ok, parsed.error
        if not parsed.ok:
            run.parse_failures[call.role] += 1
        return parsed

    def letters(self, question: Question) -> list[str] | None:
        return resolve_letters(question, self.agent.answer_mode)

    def answer_format(self, kind: str, letters: list[str] | None) -> str:
        """The answer instruction for `kind` ("direct", "boxed", "tag") in this question's mode, from its prompt file."""
        return self.prompts.get(self.answer_format_name(kind, letters)).user

    @staticmethod
    def answer_format_name(kind: str, letters: list[str] | None) -> str:
        return f"baselines/answer_{kind}_{'choice' if letters else 'short'}"
