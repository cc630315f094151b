"""Final answers in the baselines' free-text formats: `\\boxed{...}` (Search-o1), `<answer>...</answer>`
(ParallelSearch), a bare reply (Vanilla RAG, S3's generator); the option letter for multiple choice.

Each extractor returns (answer, how): `how` names the format found ("boxed", "answer_tag", "answer_line",
"letter", "raw") or "none"; "none" gives an empty answer, as the originals score an unmarked output as wrong.
Like the role parsers (`jsonparse`), they never raise and run in linear time: one pass over the tags or braces,
never a lazy regex retried from every unclosed opener.
"""

from __future__ import annotations

import re

from maps_train.agents.jsonparse import bounded, clean_text, has_content, strip_thinking, tag_contents
from maps_train.agents.outputs import ANSWER_MAX_CHARS

_BOXED = "\\boxed{"
_BOXED_OR_BRACE = re.compile(r"\\boxed\{|[{}]")
_TEXT_WRAPPER = re.compile(r"^\\text\{(.*)\}$", re.DOTALL)
# "Answer: x", "The final answer is: x". `\s*(?:is\s*)?` rather than `\s*(?:is)?\s*`: two adjacent `\s*` split a
# run of spaces every possible way before failing (quadratic in the run).
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*(?:is\s*)?[:：]\s*(.+)", re.IGNORECASE)


def last_boxed_span(text: str) -> tuple[int, int] | None:
    """Where the content of the last complete `\\boxed{...}` (nested braces allowed, last by its opening) starts
    and ends in `text`, or None.

    One pass with a depth counter and one open box: a box that has another box opened inside it can only close
    after that inner one, which then wins (it opened later), so only the innermost open box is remembered. No
    stack and no copies: memory stays constant however deep the nesting (copying every nested span of 8,192
    nested boxes took hundreds of megabytes)."""
    depth, open_box, span = 0, None, None  # open_box: (content start, depth inside it)
    for match in _BOXED_OR_BRACE.finditer(text):
        if match.group() != "}":
            depth += 1
            if match.group() == _BOXED:
                open_box = (match.end(), depth)
        elif depth > 0:
            if open_box is not None and open_box[1] == depth:
                span, open_box = (open_box[0], match.start()), None
            depth -= 1
    return span


def last_boxed(text: str) -> str | None:
    """The content of the last complete `\\boxed{...}` (nested braces allowed), `\\text{}` and `()` unwrapped."""
    text = bounded(text, keep="tail")
    span = last_boxed_span(text)
    if span is None:
        return None
    inner = text[span[0] : span[1]].strip()
    match = _TEXT_WRAPPER.match(inner)
    if match:
        inner = match.group(1).strip()
    return inner.strip("()").strip()


def choice_letter(text: str, letters: list[str]) -> str | None:
    """A lone option letter: "B", "(B)", "B.", "B) ...", "Option B", or the first standalone letter."""
    text = bounded(text).strip()
    match = re.match(r"(?:option\s+)?[\(\[]?([A-Za-z])[\)\].:]?(?:\s|$)", text, re.IGNORECASE)
    if match and match.group(1).upper() in letters:
        return match.group(1).upper()
    match = re.search(r"\b([" + "".join(re.escape(letter) for letter in letters) + r"])\b", text)
    return match.group(1) if match else None


def _finish(answer: str, how: str, letters: list[str] | None) -> tuple[str, str]:
    if letters:
        letter = choice_letter(answer, letters)
        return (letter, how) if letter else ("", "none")
    return clean_text(answer, ANSWER_MAX_CHARS), how


def _answer_tags(text: str) -> list[str]:
    """What `<answer>(.*?)</answer>` (any case) finds, in one pass."""
    return tag_contents(text, "<answer>", "</answer>", ignore_case=True)


def extract_reasoned_answer(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """Search-o1: the last `\\boxed{}`; failing that an "Answer: ..." line; else nothing."""
    text = bounded(text, keep="tail")  # the answer comes last in a long reasoning
    boxed = last_boxed(text)
    if has_content(boxed):  # not a restated `\boxed{…}`
        return _finish(boxed, "boxed", letters)
    lines = [m.group(1) for m in _ANSWER_LINE.finditer(strip_thinking(text) or text)]
    if lines:
        return _finish(lines[-1], "answer_line", letters)
    return "", "none"


def extract_answer_tag(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """ParallelSearch (Search-R1 family): the last `<answer>...</answer>` with a letter or digit in it (a restated
    placeholder such as `<answer>…</answer>` is none); else nothing."""
    tags = [tag for tag in _answer_tags(bounded(text, keep="tail")) if has_content(tag)]
    if tags:
        return _finish(tags[-1], "answer_tag", letters)
    return "", "none"


def extract_direct_answer(text: str, letters: list[str] | None = None) -> tuple[str, str]:
    """A generator asked to reply with the answer alone (Vanilla RAG, S3): the whole reply, thinking removed,
    whitespace collapsed and bounded like every method's answer (FlashRAG scores the raw generation); a boxed
    or tagged answer inside it is preferred when the model added one."""
    text = bounded(text)
    body = strip_thinking(text) if "<think>" in text or "</think>" in text else text
    boxed = last_boxed(body)
    if boxed:
        return _finish(boxed, "boxed", letters)
    tags = [tag for tag in _answer_tags(body) if tag.strip()]
    if tags:
        return _finish(tags[-1], "answer_tag", letters)
    if not body.strip():
        return "", "none"
    return _finish(body, "letter" if letters else "raw", letters)
