"""What the baselines share on top of `Engine`: an assistant turn that grows across steps (the model's text and
the spliced tool results in one partial turn, continued each step as raw text after the chat template's
generation prompt), answer-mode prompts, and the "Doc i(Title: t) text" passage format the Search-R1 family
(ParallelSearch, S3) was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from maps_train.agents.engine import Engine, QuestionRun
from maps_train.agents.evidence import passage_body, truncate_words
from maps_train.agents.jsonparse import Parsed
from maps_train.agents.maps import resolve_letters
from maps_train.errors import MapsTrainError
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

    def add_model(self, piece: str) -> None:
        self.text += piece
        self.model_pieces.append(piece)

    def add_tool(self, text: str) -> None:
        self.text += text

    def messages(self, prompt: list[dict[str, str]]) -> list[dict[str, str]]:
        """The prompt, then the partial assistant turn once there is one (sent raw: see `RawTurnBackend`)."""
        if not self.text:
            return list(prompt)
        return [*prompt, {"role": "assistant", "content": self.text}]

    @property
    def model_text(self) -> str:
        return "".join(self.model_pieces)


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
    """The plan's parse of a continuing role: the real parse runs on the whole piece the model wrote (reasoning
    included, as the originals read their raw generation), after the call; see `BaselineEngine.record_parse`."""
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
