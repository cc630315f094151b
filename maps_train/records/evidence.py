"""Evidence recall: the share of a question's gold passages that its searches found, read from its trace.

Gold passages come from the question's metadata, in every layout the project meets:
- `../shared/realdata` (and the demo world): `supporting_paragraphs` = [{title, text, corpus_id}, ...]
  (the demo world's carry only `corpus_id`);
- FlashRAG MuSiQue: `paragraphs` = [{title, paragraph_text (or text), is_supporting}, ...];
- FlashRAG HotpotQA / 2Wiki: `supporting_facts` (titles, as {"title": [...], "sent_id": [...]} or
  [[title, sent_id], ...]) with `context` ({"title": [...], "sentences" or "content": [[...], ...]} or
  [[title, [sentences]], ...]): the whole paragraph of every supporting title is a gold passage.

A retrieved passage finds a gold one when their ids are equal (the gold carries the corpus id, as realdata's do), or
else, when the passage's title and text are known, by FlashRAG's normalisation (`metrics.normalize_answer`, the
one its retrieval metrics apply to passage contents): equal normalised titles and one normalised text inside the
other (a corpus may split a gold paragraph into chunks, or hold it with more around it). FlashRAG's own
`retrieval_recall` asks whether any top-k passage holds a gold ANSWER string; the data sets here name the gold
passages themselves, so this counts those.

Per method, what the trace says was retrieved and what the answer step saw (before any shrink to fit the
context, which `prompt_tokens_dropped` counts):
- retrieved: every hit of every search (`RoundRecord.retrieved`), whatever the method;
- seen: the passages handed to the model call that turned them into the answer's input: MAPS, the union of the
  merged evidence every consolidator read (the answer call sees only their observations); Vanilla, the retrieved
  passages its generator read; Search-o1, the passages of each turn its condenser read; ParallelSearch, the
  passages spliced into its turn; S3, the documents its generator got (`generator_passage_ids`, the searcher's
  kept documents). All but S3 are the union of the rounds' `evidence_ids`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from maps_train.records.metrics import normalize_answer
from maps_train.records.trace import TraceRecord

# S3's generator context (maps_train.agents.baselines.s3 writes it on the last round's `extra`).
GENERATOR_PASSAGES = "generator_passage_ids"


@dataclass(frozen=True)
class GoldPassage:
    corpus_id: str | None  # the passage's id in the corpus, when the data set names it
    title: str
    text: str  # whitespace collapsed; "" when only the id is known

    def formatted(self) -> str:
        """"title\\ntext", as encoders see a passage."""
        return f"{self.title}\n{self.text}".strip()


class PassageText(Protocol):
    """A retrieved passage's title and text (`retrieval.corpus.Passage`, looked up by id: traces keep only ids)."""

    @property
    def title(self) -> str: ...

    @property
    def text(self) -> str: ...


def _gold(title: Any, text: Any, corpus_id: Any = None) -> GoldPassage | None:
    text = " ".join(str(text or "").split())
    corpus_id = str(corpus_id) if corpus_id not in (None, "") else None
    if not text and corpus_id is None:
        return None
    return GoldPassage(corpus_id, str(title or "").strip(), text)


def _from_supporting_paragraphs(metadata: Mapping[str, Any]) -> list[GoldPassage]:
    found = []
    for para in metadata.get("supporting_paragraphs") or []:
        if isinstance(para, dict):
            gold = _gold(para.get("title"), para.get("text") or para.get("paragraph_text"), para.get("corpus_id"))
            if gold:
                found.append(gold)
    return found


def _from_flagged_paragraphs(metadata: Mapping[str, Any]) -> list[GoldPassage]:
    found = []
    for para in metadata.get("paragraphs") or []:
        if isinstance(para, dict) and para.get("is_supporting") is True:
            gold = _gold(para.get("title"), para.get("paragraph_text") or para.get("text"), para.get("corpus_id"))
            if gold and gold.text:
                found.append(gold)
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


def _from_supporting_facts(metadata: Mapping[str, Any]) -> list[GoldPassage]:
    titles = list(dict.fromkeys(_supporting_titles(metadata.get("supporting_facts"))))
    if not titles:
        return []
    by_title: dict[str, str] = {}
    for title, sentences in _context_paragraphs(metadata.get("context")):
        by_title.setdefault(title, " ".join(str(s).strip() for s in sentences))
    return [g for g in (_gold(t, by_title.get(t)) for t in titles) if g]


def gold_evidence(metadata: Mapping[str, Any] | None) -> list[GoldPassage]:
    """The question's gold passages, deduplicated in order; [] when its data set names none."""
    if not metadata:
        return []
    for reader in (_from_supporting_paragraphs, _from_flagged_paragraphs, _from_supporting_facts):
        found = reader(metadata)
        if found:
            return list(dict.fromkeys(found))
    return []


def malformed_gold(metadata: Mapping[str, Any] | None) -> int:
    """How many gold passages the question's metadata names but `gold_evidence` cannot use, in the first layout
    it holds: a `supporting_paragraphs` entry that is no object or has neither text nor corpus id, a paragraph
    flagged `is_supporting` without text, a supporting title with no context paragraph, or a gold key whose value
    is no list at all (counted once). Scored as misses (or not at all): `suite` reports them per data set."""
    if not isinstance(metadata, Mapping):
        return 0
    supporting = metadata.get("supporting_paragraphs")
    if supporting is not None:
        if not isinstance(supporting, list):
            return 1
        return sum(1 for para in supporting if not isinstance(para, dict) or _gold(
            para.get("title"), para.get("text") or para.get("paragraph_text"), para.get("corpus_id")) is None)
    paragraphs = metadata.get("paragraphs")
    if paragraphs is not None:
        if not isinstance(paragraphs, list):
            return 1
        flagged = [para for para in paragraphs if isinstance(para, dict) and para.get("is_supporting") is True]
        if flagged:
            return sum(1 for para in flagged if not " ".join(str(para.get("paragraph_text") or para.get("text")
                                                                or "").split()))
    facts = metadata.get("supporting_facts")
    if facts is None:
        return 0
    titles = list(dict.fromkeys(_supporting_titles(facts)))
    if not titles:
        return 1 if facts else 0
    texts = {title: " ".join(str(s).strip() for s in sentences).strip()
             for title, sentences in _context_paragraphs(metadata.get("context"))}
    return sum(1 for title in titles if not texts.get(title))


def absent_gold_ids(gold: list[GoldPassage], corpus_ids: set[str]) -> int:
    """How many of `gold` name a corpus id that is not among `corpus_ids` (the ids found in the corpus): no hit can
    match them by id; one with text may still match by title and text, one without is a certain miss."""
    return sum(1 for g in gold if g.corpus_id is not None and g.corpus_id not in corpus_ids)


def retrieved_ids(trace: TraceRecord) -> list[str]:
    """Every hit of every search of the trace, deduplicated in the order found."""
    return list(dict.fromkeys(pid for round_ in trace.rounds for hits in round_.retrieved for pid in hits.passage_ids))


def seen_ids(trace: TraceRecord) -> list[str]:
    """The passages the answer step's input was made from (see the module docstring, per method)."""
    if trace.rounds and GENERATOR_PASSAGES in trace.rounds[-1].extra:
        return [str(pid) for pid in trace.rounds[-1].extra[GENERATOR_PASSAGES]]
    return list(dict.fromkeys(pid for round_ in trace.rounds for pid in round_.evidence_ids))


def _same_passage(gold: GoldPassage, passage: PassageText) -> bool:
    if normalize_answer(gold.title) != normalize_answer(passage.title):
        return False
    gold_text, text = normalize_answer(gold.text), normalize_answer(passage.text)
    return bool(gold_text and text) and (gold_text in text or text in gold_text)


def found(gold: GoldPassage, passage_ids: Iterable[str], passages: Mapping[str, PassageText]) -> bool:
    """Whether any of `passage_ids` is the gold passage: by id, else by normalised title and text."""
    for pid in passage_ids:
        if gold.corpus_id is not None and pid == gold.corpus_id:
            return True
        passage = passages.get(pid)
        if passage is not None and gold.text and _same_passage(gold, passage):
            return True
    return False


def evidence_recall(
    gold: list[GoldPassage], passage_ids: Iterable[str], passages: Mapping[str, PassageText] | None = None
) -> float | None:
    """Share of `gold` among `passage_ids`; None when the question has no gold passages (nothing to recall)."""
    if not gold:
        return None
    passage_ids = list(passage_ids)
    passages = passages or {}
    return sum(found(g, passage_ids, passages) for g in gold) / len(gold)


def needs_passage_text(gold: list[GoldPassage]) -> bool:
    """Whether matching needs the retrieved passages' text: some gold passage carries no corpus id."""
    return any(g.corpus_id is None for g in gold)


__all__ = [
    "GoldPassage", "PassageText", "absent_gold_ids", "evidence_recall", "found", "gold_evidence", "malformed_gold",
    "needs_passage_text", "retrieved_ids", "seen_ids",
]
