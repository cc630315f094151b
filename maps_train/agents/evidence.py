"""Evidence and context as prompt text: merged passages, observations, the question with its options."""

from __future__ import annotations

import re

from maps_train.agents.outputs import option_letters
from maps_train.questions import Question
from maps_train.retrieval.base import Hit

NO_OBSERVATIONS = "(none yet)"
NO_STATE = "(empty: nothing is known yet)"
NO_EVIDENCE = "(no passages were retrieved)"


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


def format_passages(hits: list[Hit], max_words: int) -> str:
    if not hits:
        return NO_EVIDENCE
    lines = []
    for number, hit in enumerate(hits, start=1):
        title = f"{hit.title}: " if hit.title else ""
        lines.append(f"[{number}] {title}{truncate_words(passage_body(hit), max_words)}")
    return "\n".join(lines)


def format_observations(observations: list[str]) -> str:
    if not observations:
        return NO_OBSERVATIONS
    return "\n".join(f"o{number}: {text}" for number, text in enumerate(observations, start=1))


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
