"""What the baselines share on top of `Engine`: an assistant turn that grows across steps (the model's text and
the spliced tool results in one partial message, continued each step), answer-mode prompts, and the
"Doc i(Title: t) text" passage format the Search-R1 family (ParallelSearch, S3) was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from maps_train.agents.engine import Engine
from maps_train.agents.evidence import passage_body, truncate_words
from maps_train.agents.maps import resolve_letters
from maps_train.errors import MapsTrainError
from maps_train.llm.types import Backend, ChatRequest, Completion
from maps_train.questions import Question
from maps_train.records.trace import RoleCall
from maps_train.retrieval.base import Hit


class ContinuingBackend:
    """Marks every request whose last message is the assistant's as a partial turn to continue
    (`continue_final_message=True`): the chat template renders that message open, so the model goes on writing
    the same turn after the spliced tool results, as the originals do with a raw prompt string."""

    def __init__(self, inner: Backend):
        self.inner = inner

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        marked = [
            replace(req, continue_final_message=True)
            if req.messages and req.messages[-1].get("role") == "assistant" and not req.continue_final_message
            else req
            for req in requests
        ]
        return self.inner.generate(marked)

    def __getattr__(self, name: str):  # ledger, close, ... of the wrapped router
        return getattr(self.inner, name)


@dataclass
class Turn:
    """The growing assistant turn of a tool-using baseline: the model's own pieces and the spliced results."""

    text: str = ""  # everything so far, as the model sees it when it continues
    model_pieces: list[str] = field(default_factory=list)  # only what the model wrote (for answer extraction)

    def add_model(self, piece: str) -> None:
        self.text += piece
        self.model_pieces.append(piece)

    def add_tool(self, text: str) -> None:
        self.text += text

    def messages(self, prompt: list[dict[str, str]]) -> list[dict[str, str]]:
        """The prompt, then the partial assistant message once there is one."""
        if not self.text:
            return list(prompt)
        return [*prompt, {"role": "assistant", "content": self.text}]

    @property
    def model_text(self) -> str:
        return "".join(self.model_pieces)


def model_piece(call: RoleCall) -> str:
    """What the model wrote in this call, as it goes back into its own turn. Backends split a leading `<think>`
    block off into `reasoning` (Qwen3 thinking); the Search-R1 family writes `<think>...</think>` as plain text
    before its action, so the block is put back (its whitespace normalised). An empty answer after the reasoning
    is read as a block still open (the stop string came inside it)."""
    if call.reasoning is None:
        return call.raw_text
    if not call.raw_text:
        return f"<think>\n{call.reasoning}"
    return f"<think>\n{call.reasoning}\n</think>\n\n{call.raw_text}"


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


class BaselineEngine(Engine):
    """An `Engine` whose backend continues partial assistant turns; answer-mode prompt helpers."""

    continuing_roles: tuple[str, ...] = ()  # roles whose assistant turn is continued across steps

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = ContinuingBackend(self.backend)
        for name in ("top_k", "max_searches", "max_turns"):
            if getattr(self.agent, name) < 1:
                raise MapsTrainError(f"agent.{name}: must be at least 1, got {getattr(self.agent, name)}")
        for role in self.continuing_roles:
            if self.recipe.route(role).enable_thinking:
                # Qwen3's template renders a continued assistant message after an empty think block, so a turn
                # that stopped inside thinking cannot be resumed where it stopped.
                raise MapsTrainError(
                    f"roles.{role}.enable_thinking: {self.method} continues the {role}'s turn after each search, "
                    "which Qwen3's chat template cannot do inside a thinking block; set it to false (the model then "
                    "reasons in its visible text, as the original does with instruct models)"
                )

    def letters(self, question: Question) -> list[str] | None:
        return resolve_letters(question, self.agent.answer_mode)

    def answer_format(self, kind: str, letters: list[str] | None) -> str:
        """The answer instruction for `kind` ("direct", "boxed", "tag") in this question's mode, from its prompt file."""
        return self.prompts.get(self.answer_format_name(kind, letters)).user

    @staticmethod
    def answer_format_name(kind: str, letters: list[str] | None) -> str:
        return f"baselines/answer_{kind}_{'choice' if letters else 'short'}"
