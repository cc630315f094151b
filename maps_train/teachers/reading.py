"""What a role's prompt shows, read back from the prompt itself: the annotation teacher gets only the chat messages
of a call, so it reads the question, the knowledge gathered so far, the reasoning state, its direction and the
passages out of them.

The prompt files (`maps_train/agents/prompts/maps/*.txt`, or `agent.prompts_dir`'s) are read as patterns: their
literal text must match and each `{{slot}}` captures what was filled in, so a changed prompt file changes the
reading with it. Also here: what a prompt shows as words (`visible_words`), and the check that a written text
names no entity the prompt does not show (`unseen_entities`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from maps_train.agents.prompt_context import NO_EVIDENCE, NO_OBSERVATIONS
from maps_train.agents.prompting import PromptLibrary, PromptTemplate
from maps_train.records.metrics import normalize_answer

# The prompt files each role's calls may come from (MAPS; the `_coupled` ablation files add the trajectory).
ROLE_PROMPTS = {
    "proposer": ("maps/proposer", "maps/proposer_coupled"),
    "writer": ("maps/writer", "maps/writer_coupled", "maps/writer_direct", "maps/writer_direct_coupled"),
    "consolidator": ("maps/consolidator", "maps/consolidator_coupled"),
    "answer": ("maps/answer_short", "maps/answer_short_coupled", "maps/answer_choice", "maps/answer_choice_coupled"),
}
_SLOT = re.compile(r"\{\{(\w+)\}\}")
_OBSERVATION = re.compile(r"^o\d+: ", re.MULTILINE)
_PASSAGE = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)
_WORD = re.compile(r"\w+")
_POSSESSIVE = re.compile(r"(\w)['’]s\b")  # "Rankin's" holds "Rankin": the possessive is a word of its own
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# Capitalised words that name no entity: question words and the like, at the start of a sentence.
STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or is was are were be been who whom whose what which when where "
    "why how did does do find out about as that this these those it its his her their s".split()
)


@dataclass
class Passage:
    number: int
    line: str  # "Title: text" as the prompt shows it

    def has_title(self, title: str) -> bool:
        return bool(title) and (self.line.startswith(title + ": ") or self.line == title)

    def split(self, titles: tuple[str, ...] = ()) -> tuple[str, str]:
        """(title, text): a known title where the line starts with one, else the line's text before its first ": "."""
        for title in titles:
            if self.has_title(title):
                return title, self.line[len(title) + 2:]
        title, _, text = self.line.partition(": ")
        return (title, text) if text else ("", self.line)


@dataclass
class PromptView:
    """The slots of one role call's prompt (those its template has)."""

    template: str
    question: str = ""
    observations: list[str] = field(default_factory=list)
    state: str = ""
    direction: str | None = None
    passages: list[Passage] = field(default_factory=list)
    num: int = 1  # num_directions / num_queries

    @property
    def knowledge(self) -> str:
        """What the earlier rounds recorded: the observations and the reasoning state."""
        return "\n".join([*self.observations, self.state])

    @property
    def shown(self) -> str:
        """Every slot's text: what the call may name (the instructions around them are the same for any question)."""
        parts = [self.question, self.knowledge, self.direction or ""]
        return "\n".join(parts + [passage.line for passage in self.passages])


def template_pattern(template: PromptTemplate) -> re.Pattern[str]:
    """The user message's literal text, each slot a lazy group (a repeated slot must repeat its first value)."""
    parts, seen, at = [], set(), 0
    for match in _SLOT.finditer(template.user):
        parts.append(re.escape(template.user[at:match.start()]))
        name = match.group(1)
        parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.*?)")
        seen.add(name)
        at = match.end()
    parts.append(re.escape(template.user[at:]))
    return re.compile(r"\A" + "".join(parts) + r"\Z", re.DOTALL)


class PromptReader:
    """Reads calls' prompts against the prompt files the MAPS engine renders them from."""

    def __init__(self, prompts_dir: str | None = None):
        self.library = PromptLibrary(prompts_dir)
        self._patterns: dict[str, re.Pattern[str]] = {}

    def pattern(self, name: str) -> re.Pattern[str]:
        if name not in self._patterns:
            self._patterns[name] = template_pattern(self.library.get(name))
        return self._patterns[name]

    def read(self, role: str, messages: list[dict[str, str]]) -> PromptView | None:
        """The view of a `role` call's prompt, or None when no prompt file of the role renders it."""
        users = [m["content"] for m in messages if m.get("role") == "user"]
        if not users:
            return None
        for name in ROLE_PROMPTS.get(role, ()):
            match = self.pattern(name).match(users[-1])
            if match:
                return view_of(name, match.groupdict())
        return None


def view_of(name: str, slots: dict[str, str]) -> PromptView:
    observations = slots.get("observations", NO_OBSERVATIONS)
    evidence = slots.get("evidence", NO_EVIDENCE)
    number = slots.get("num_directions") or slots.get("num_queries") or "1"
    return PromptView(
        template=name,
        question=slots.get("question", "").strip(),
        observations=[line.strip() for line in _OBSERVATION.split(observations) if line.strip()]
        if observations.strip() != NO_OBSERVATIONS else [],
        state=slots.get("state", "").strip(),
        direction=slots.get("direction"),
        passages=[Passage(int(m.group(1)), m.group(2).strip()) for m in _PASSAGE.finditer(evidence)],
        num=int(number) if number.isdigit() else 1,
    )


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def visible_words(text: str) -> set[str]:
    return set(words(text))


def entity_words(text: str) -> list[str]:
    """The words of `text` that may name an entity: written with a capital or a digit, and not a stopword."""
    return [w for w in _WORD.findall(text) if (not w.islower() or any(c.isdigit() for c in w))
            and w.lower() not in STOPWORDS]


def unseen_entities(text: str, shown: str) -> list[str]:
    """The entity words of `text` that `shown` does not hold (the check every written query and direction passes)."""
    seen = visible_words(shown)
    return [w for w in entity_words(text) if w.lower() not in seen]


def only_shown(text: str, shown: str) -> str:
    """`text` without the entity words that `shown` does not hold, nor its short unshown words: an annotation's
    lower-case acronym ("the mlb mvp award") names an entity as much as a capitalised one."""
    seen = visible_words(shown)

    def unseen(word: str) -> bool:
        return word.lower() not in seen and (word in entity_words(word) or (len(word) <= 3 and word not in STOPWORDS))

    return " ".join(w for w in text.split() if not any(unseen(part) for part in _WORD.findall(w)))


def holds(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text`, both normalised (FlashRAG's answer normalisation), on word boundaries."""
    needle = _normalized(phrase)
    return bool(needle) and f" {needle} " in f" {_normalized(text)} "


def _normalized(text: str) -> str:
    return normalize_answer(_POSSESSIVE.sub(r"\1 's", text))


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text.strip()) if s.strip()]


def shingles(text: str, size: int = 6) -> set[str]:
    tokens = normalize_answer(text).split()
    return {" ".join(tokens[i:i + size]) for i in range(max(0, len(tokens) - size + 1))}
