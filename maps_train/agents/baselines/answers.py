"""Final answers in the baselines' free-text formats: `\\boxed{...}` (Search-o1), `<answer>...</answer>`
(ParallelSearch), a bare reply (Vanilla RAG, S3's generator); the option letter for multiple choice.

Each extractor returns (answer, how): `how` names the format found ("boxed", "answer_tag", "answer_line",
"letter", "raw") or "none"; "none" gives an empty answer, as the originals score an unmarked output as wrong.
"""

from __future__ import annotations

import re

from maps_train.agents.jsonparse import clean_text, strip_thinking
from maps_train.agents.outputs import ANSWER_MAX_CHARS

_BOXED = "\\boxed{"
_TEXT_WRAPPER = re.compile(r"^\\text\{(.*)\}$", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:：]\s*(.+)", re.IGNORECASE)


def _balanced(text: str, start: int) -> str | None:
    """The text inside the braces opened just before `start`, or None when they never close."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` (nested braces allowed), `\\text{}` and `()` unwrapped."""
    position = text.rfind(_BOXED)
    while position >= 0:
        inner = _balanced(text, position + len(_BOXED))
        if inner is not None:
            inner = inner.strip()
            match = _TEXT_WRAPPER.match(inner)
            if match:
                inner = match.group(1).strip()
            return inner.strip("()").strip()
        position = text.rfind(_BOXED, 0, position)
    return None


def choice_letter(text: str, letters: list[str]) -> str | None:
    """A lone option letter: "B", "(B)", "B.", "B) ...", "Option B", or the first standalone letter."""
    text = text.strip()
    match = re.match(r"^(?:option\s+)?[\(\[]?([A-Za-z])[\)\].:]?(?:\s|$)", text, re.IGNORECASE)
    if match and match.group(1).upper() in letters:
        return match.group(1).upper()
    match = re.search(rf"\b([{''.join(letters)}])\b", text)
    return match.group(1) if match else None


def _finish(answer: str, how: str, letters: list[str] | None) -> tuple[str, str]:
    if letters:
        letter = choice_letter(answer, letters)
        return (letter, how) if letter else ("", "none")
    return clean_text(answer, ANSWER_MAX_CHARS), how


def extract_reasoned_answer(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """Search-o1: the last `\\boxed{}`; failing that an "Answer: ..." line; else nothing."""
    boxed = last_boxed(text)
    if boxed:
        return _finish(boxed, "boxed", letters)
    lines = [m.group(1) for m in _ANSWER_LINE.finditer(strip_thinking(text) or text)]
    if lines:
        return _finish(lines[-1], "answer_line", letters)
    return "", "none"


def extract_answer_tag(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """ParallelSearch (Search-R1 family): the last `<answer>...</answer>`; else nothing."""
    tags = [m.group(1) for m in _ANSWER_TAG.finditer(text) if m.group(1).strip()]
    if tags:
        return _finish(tags[-1], "answer_tag", letters)
    return "", "none"


def extract_direct_answer(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """A generator asked to reply with the answer alone (Vanilla RAG, S3): the whole reply, thinking removed,
    whitespace collapsed and bounded like every method's answer (FlashRAG scores the raw generation); a boxed
    or tagged answer inside it is preferred when the model added one."""
    body = strip_thinking(text) if "<think>" in text or "</think>" in text else text
    boxed = last_boxed(body)
    if boxed:
        return _finish(boxed, "boxed", letters)
    tags = [t for t in _ANSWER_TAG.findall(body) if t.strip()]
    if tags:
        return _finish(tags[-1], "answer_tag", letters)
    if not body.strip():
        return "", "none"
    return _finish(body, "letter" if letters else "raw", letters)
