"""What a prompt shows besides its instructions, as text: merged passages, observations, the question with its
options; and the same as `ShrinkableSlot`s, for a prompt that has to shrink to fit the context (oldest
observations first, then lowest-ranked passages, then the middle of the best one)."""

from __future__ import annotations

import math
import re

from maps_train.agents.outputs import option_letters
from maps_train.agents.prompting import ShrinkableSlot
from maps_train.questions import Question
from maps_train.retrieval.base import Hit

NO_OBSERVATIONS = "(none yet)"
NO_STATE = "(empty: nothing is known yet)"
NO_EVIDENCE = "(no passages were retrieved)"
LEFT_OUT = "left out to fit the context"
# Shrink order of a prompt's slots: the oldest context goes before this round's evidence.
TRAJECTORY_ORDER, OBSERVATIONS_ORDER, EVIDENCE_ORDER = 0, 1, 2


def merge_hits(hit_lists: list[list[Hit]]) -> list[Hit]:
    """One evidence set from several ranked lists: deduplicated by passage id, interleaved by rank (every
    sub-query's best passage before any second-best), so each direction is represented near the top."""
    merged: list[Hit] = []
    seen: set[str] = set()
    depth = max((len(hits) for hits in hit_lists), default=0)
    for rank in range(depth):
        for hits in hit_lists:
            if rank < len(hits) and hits[rank].id not in seen:
                seen.add(hits[rank].id)
                merged.append(hits[rank])
    return merged


def passage_body(hit: Hit) -> str:
    """The passage text without a leading copy of its title (FlashRAG `contents` start with the title line)."""
    text = hit.text.strip()
    title = hit.title.strip().strip('"')
    first_line, newline, rest = text.partition("\n")
    if title and newline and first_line.strip().strip('"') == title:
        text = rest.strip()
    return text


def truncate_words(text: str, max_words: int) -> str:
    words = text.split()
    if max_words <= 0 or len(words) <= max_words:
        return " ".join(words)
    return " ".join(words[:max_words]) + " ..."


def left_out_note(noun: str, first: str, last: str) -> str:
    """What a shrunk slot says in place of its pieces: "(passage [3] left out ...)", "(passages [2]-[3] ...)"."""
    if first == last:
        return f"({noun} {first} {LEFT_OUT})"
    return f"({noun}s {first}-{last} {LEFT_OUT})"


def format_passages(hits: list[Hit], max_words: int) -> str:
    if not hits:
        return NO_EVIDENCE
    return "\n".join(_passage_line(number, hit, max_words) for number, hit in enumerate(hits, start=1))


def _passage_line(number: int, hit: Hit, max_words: int, cut_words: int = 0) -> str:
    title = f"{hit.title}: " if hit.title else ""
    body = truncate_words(passage_body(hit), max_words)
    return f"[{number}] {title}{cut_middle_words(body, cut_words)}"


def cut_middle_words(text: str, cut: int) -> str:
    """`text` without `cut` words from its middle (its opening and its end stay, split evenly)."""
    words = text.split()
    if cut <= 0 or not words:
        return text
    kept = max(0, len(words) - cut)
    return " ".join([*words[: (kept + 1) // 2], f"[... {LEFT_OUT} ...]", *words[len(words) - kept // 2 :]])


def passages_slot(hits: list[Hit], max_words: int, cut_steps: int = 8) -> ShrinkableSlot:
    """`format_passages` as a slot: step k leaves out the k lowest-ranked passages (the best one stays); the
    `cut_steps` steps after that cut the best passage's middle, a further 1/cut_steps of its words each."""
    if not hits:
        return ShrinkableSlot(0, lambda k: NO_EVIDENCE, EVIDENCE_ORDER)
    best_words = len(truncate_words(passage_body(hits[0]), max_words).split())
    per_step = math.ceil(best_words / cut_steps)

    def text(k: int) -> str:
        kept = max(1, len(hits) - k)
        if k <= 0:
            return format_passages(hits, max_words)
        cut = max(0, k - (len(hits) - 1)) * per_step
        lines = [_passage_line(1, hits[0], max_words, cut)]
        lines += [_passage_line(n, hit, max_words) for n, hit in enumerate(hits[1:kept], start=2)]
        if kept < len(hits):
            lines.append(left_out_note("passage", f"[{kept + 1}]", f"[{len(hits)}]"))
        return "\n".join(lines)

    return ShrinkableSlot(len(hits) - 1 + (cut_steps if best_words else 0), text, EVIDENCE_ORDER)


def format_observations(observations: list[str], first_number: int = 1) -> str:
    if not observations:
        return NO_OBSERVATIONS
    return "\n".join(f"o{number}: {text}" for number, text in enumerate(observations, start=first_number))


def observations_slot(observations: list[str]) -> ShrinkableSlot:
    """`format_observations` as a slot: step k leaves out o1..ok (the reasoning state still sums them up)."""

    def text(k: int) -> str:
        if k <= 0:
            return format_observations(observations)
        note = left_out_note("observation", "o1", f"o{k}")
        kept = observations[k:]
        return note if not kept else note + "\n" + format_observations(kept, first_number=k + 1)

    return ShrinkableSlot(len(observations), text, OBSERVATIONS_ORDER)


def format_state(state: str) -> str:
    return state.strip() or NO_STATE


def format_question(question: Question) -> str:
    """The question, followed by lettered options for multiple choice."""
    if not question.options:
        return question.question.strip()
    letters = option_letters(len(question.options))
    options = "\n".join(f"{letter}. {option}" for letter, option in zip(letters, question.options))
    return f"{question.question.strip()}\n\nOptions:\n{options}"


def first_sentences(hits: list[Hit], max_passages: int = 3, max_chars: int = 600) -> str:
    """A crude observation when the consolidator's output is unusable: each top passage's first sentence."""
    sentences = []
    for hit in hits[:max_passages]:
        body = " ".join(passage_body(hit).split())
        first = re.split(r"(?<=[.!?])\s", body, maxsplit=1)[0]
        title = f"{hit.title}: " if hit.title else ""
        sentences.append(f"{title}{first}")
    text = " ".join(sentences) or "No relevant information was retrieved."
    return text[:max_chars]
