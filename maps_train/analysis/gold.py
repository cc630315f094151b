"""Gold evidence passages of a question, read from its metadata in every layout the project meets.

- `../shared/realdata` (and the demo world): `supporting_paragraphs` = [{title, text, corpus_id}, ...];
- FlashRAG MuSiQue: `paragraphs` = [{title, paragraph_text (or text), is_supporting}, ...];
- FlashRAG HotpotQA / 2Wiki: `supporting_facts` (titles, as {"title": [...], "sent_id": [...]} or
  [[title, sent_id], ...]) with `context` ({"title": [...], "sentences" or "content": [[...], ...]} or
  [[title, [sentences]], ...]): the whole paragraph of every supporting title is a gold passage.

A passage is "title\\ntext". A paragraph known only by its `corpus_id` (the demo world) gets its text from a
corpus when one is given (`passages_by_id`); otherwise it is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _passage(title: Any, text: Any) -> str | None:
    text = " ".join(str(text or "").split())
    if not text:
        return None
    return f"{str(title or '').strip()}\n{text}".strip()


def _from_supporting_paragraphs(metadata: Mapping[str, Any], passages_by_id: Mapping[str, str]) -> list[str]:
    found = []
    for para in metadata.get("supporting_paragraphs") or []:
        if not isinstance(para, dict):
            continue
        text = para.get("text") or para.get("paragraph_text")
        if text:
            passage = _passage(para.get("title"), text)
        else:
            passage = passages_by_id.get(str(para.get("corpus_id")))
        if passage:
            found.append(passage)
    return found


def _from_flagged_paragraphs(metadata: Mapping[str, Any]) -> list[str]:
    found = []
    for para in metadata.get("paragraphs") or []:
        if isinstance(para, dict) and para.get("is_supporting") is True:
            passage = _passage(para.get("title"), para.get("paragraph_text") or para.get("text"))
            if passage:
                found.append(passage)
    return found


def _supporting_titles(facts: Any) -> list[str]:
    if isinstance(facts, dict):
        titles = facts.get("title") or []
        return [str(t) for t in titles] if isinstance(titles, list) else []
    if isinstance(facts, list):
        return [str(f[0]) for f in facts if isinstance(f, list | tuple) and f]
    return []


def _context_paragraphs(context: Any) -> list[tuple[str, list[str]]]:
    """(title, sentences) of every context paragraph, in either FlashRAG layout."""
    if isinstance(context, dict):
        titles = context.get("title") or []
        bodies = context.get("sentences", context.get("content")) or []
        if isinstance(titles, list) and isinstance(bodies, list):
            return [(str(t), s if isinstance(s, list) else [str(s)]) for t, s in zip(titles, bodies)]
        return []
    paragraphs = []
    if isinstance(context, list):
        for item in context:
            if isinstance(item, list | tuple) and len(item) == 2:
                sentences = item[1] if isinstance(item[1], list) else [str(item[1])]
                paragraphs.append((str(item[0]), sentences))
    return paragraphs


def _from_supporting_facts(metadata: Mapping[str, Any]) -> list[str]:
    titles = list(dict.fromkeys(_supporting_titles(metadata.get("supporting_facts"))))
    if not titles:
        return []
    by_title = {}
    for title, sentences in _context_paragraphs(metadata.get("context")):
        by_title.setdefault(title, " ".join(str(s).strip() for s in sentences))
    return [p for p in (_passage(t, by_title.get(t)) for t in titles) if p]


def gold_passages(metadata: Mapping[str, Any] | None, passages_by_id: Mapping[str, str] | None = None) -> list[str]:
    """The question's gold evidence passages ("title\\ntext"), deduplicated in order; [] when none are known."""
    if not metadata:
        return []
    passages_by_id = passages_by_id or {}
    for reader in (
        lambda m: _from_supporting_paragraphs(m, passages_by_id),
        _from_flagged_paragraphs,
        _from_supporting_facts,
    ):
        found = reader(metadata)
        if found:
            return list(dict.fromkeys(found))
    return []


def gold_corpus_ids(metadata: Mapping[str, Any] | None) -> list[str]:
    """Corpus ids of supporting paragraphs that carry no text (looked up in a corpus by the caller)."""
    ids = []
    for para in (metadata or {}).get("supporting_paragraphs") or []:
        if isinstance(para, dict) and not para.get("text") and para.get("corpus_id"):
            ids.append(str(para["corpus_id"]))
    return ids
