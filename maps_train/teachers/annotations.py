"""The search a question's data set annotates, as hops: what each step looks for, about which entity, and what it
finds. One reader per data set, each from the question's own metadata (../shared/realdata layouts):

- MuSiQue `question_decomposition`: "X >> relation" (a Wikidata relation of entity X), "#1 >> relation" (of hop 1's
  answer) or a natural-language hop question with "#k" placeholders; each with its answer and supporting paragraph;
- 2WikiMultihopQA `evidences`: (subject, relation, object) triples; a subject that is an earlier triple's object is
  that hop's answer (a bridge);
- HotpotQA `supporting_facts`: the supporting passages' titles (bridge or comparison); a hop is resolved by reading
  its passage, it has no answer string of its own;
- PopQA: `subj` and `prop`, answered by `obj` and its aliases;
- NQ (and any other data set with gold passages only): one hop, resolved by a passage holding a gold answer; its
  entity is the gold passage's title only where the question names it, else the search has nothing to go on and
  the proposer and writer fall back (`teachers.backend`).

The hops say what to look for; the policies (`teachers.policy`) only ever write an entity that their prompt shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from maps_train.questions import Question, load_questions

_REF = re.compile(r"#(\d+)")
_PARENTHESIS = re.compile(r"\s*\([^()]*\)$")  # "Free Guy (film)": the article's disambiguation, not the entity


@dataclass(frozen=True)
class Hop:
    """One step of the annotated search. `subject`: the entity it is about, written out (None: a hop question that
    names its entities itself, or nothing); `ref`: the index of the earlier hop whose answer is its entity;
    `relation`: what it asks of the entity; `question`: a natural-language hop question ("#k" for hop k's answer);
    `answers`: what it finds (empty: it is resolved by reading a passage titled one of `titles`)."""

    subject: str | None = None
    ref: int | None = None
    relation: str = ""
    question: str | None = None
    answers: tuple[str, ...] = ()
    titles: tuple[str, ...] = ()
    passages: tuple[str, ...] = ()  # the supporting passages' texts (a title-resolved hop's facts)


@dataclass(frozen=True)
class Annotation:
    """A question's hops, its gold answers and its data set; `searchable` is False when the annotation names no
    entity the prompts can show (NQ), so the proposer and writer have nothing to go on."""

    question_id: str
    dataset: str
    question: str
    golden_answers: tuple[str, ...]
    hops: tuple[Hop, ...] = ()
    kind: str = ""  # the data set's type where it gives one (HotpotQA bridge/comparison, 2Wiki's)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def searchable(self) -> bool:
        return any(hop.subject or hop.question or hop.ref is not None for hop in self.hops)


def _paragraph_titles(metadata: Mapping[str, Any]) -> dict[int, tuple[str, str]]:
    found = {}
    for position, para in enumerate(metadata.get("paragraphs") or []):
        if isinstance(para, dict):
            index = para.get("idx", position)
            text = para.get("text") or para.get("paragraph_text") or ""
            found[int(index) if isinstance(index, int) else position] = (str(para.get("title") or ""), str(text))
    return found


def musique_hops(metadata: Mapping[str, Any]) -> list[Hop]:
    paragraphs = _paragraph_titles(metadata)
    hops = []
    for step in metadata.get("question_decomposition") or []:
        if not isinstance(step, dict) or not isinstance(step.get("question"), str):
            continue
        text, answer = step["question"].strip(), str(step.get("answer") or "").strip()
        support = paragraphs.get(step.get("paragraph_support_idx"))  # type: ignore[arg-type]
        titles = (support[0],) if support and support[0] else ()
        passages = (support[1],) if support and support[1] else ()
        answers = (answer,) if answer else ()
        if ">>" in text:
            subject, _, relation = (part.strip() for part in text.partition(">>"))
            ref = _REF.fullmatch(subject)
            hops.append(Hop(subject=None if ref else subject, ref=int(ref.group(1)) - 1 if ref else None,
                            relation=relation, answers=answers, titles=titles, passages=passages))
        else:
            refs = _REF.findall(text)
            hops.append(Hop(ref=int(refs[0]) - 1 if refs else None, question=text, answers=answers, titles=titles,
                            passages=passages))
    return hops


def _supporting(metadata: Mapping[str, Any]) -> dict[str, str]:
    return {str(p.get("title") or ""): str(p.get("text") or "") for p in metadata.get("supporting_paragraphs") or []
            if isinstance(p, dict)}


def wiki2_hops(metadata: Mapping[str, Any]) -> list[Hop]:
    supporting = _supporting(metadata)
    hops: list[Hop] = []
    objects: dict[str, int] = {}
    for triple in metadata.get("evidences") or []:
        if not (isinstance(triple, list | tuple) and len(triple) == 3 and all(isinstance(t, str) for t in triple)):
            continue
        subject, relation, answer = (t.strip() for t in triple)
        ref = objects.get(subject.lower())
        text = supporting.get(subject, "")
        hops.append(Hop(subject=None if ref is not None else subject, ref=ref, relation=relation, answers=(answer,),
                        titles=(subject,), passages=(text,) if text else ()))
        objects.setdefault(answer.lower(), len(hops) - 1)
    return hops


def hotpot_hops(metadata: Mapping[str, Any]) -> list[Hop]:
    supporting = _supporting(metadata)
    facts = metadata.get("supporting_facts") or []
    titles = list(dict.fromkeys(str(f[0]) for f in facts if isinstance(f, list | tuple) and f))
    return [Hop(subject=_PARENTHESIS.sub("", title) or title, titles=(title,),
                passages=(supporting[title],) if supporting.get(title) else ()) for title in titles]


def popqa_hops(metadata: Mapping[str, Any], golden: Iterable[str]) -> list[Hop]:
    subject, relation = metadata.get("subj"), metadata.get("prop")
    if not isinstance(subject, str) or not isinstance(relation, str):
        return []
    named = [*golden, str(metadata.get("obj") or ""), *(str(a) for a in metadata.get("o_aliases") or [])]
    answers = tuple(answer for answer in dict.fromkeys(named) if answer)
    title = str(metadata.get("s_wiki_title") or subject)
    return [Hop(subject=subject, relation=relation, answers=answers, titles=(title,))]


def passage_hops(metadata: Mapping[str, Any], question: str, golden: Iterable[str]) -> list[Hop]:
    """One hop per gold passage, answered by a gold answer; its entity is the title where the question names it."""
    hops = []
    for title, text in _supporting(metadata).items():
        named = title and title.lower() in question.lower()
        hops.append(Hop(subject=title if named else None, answers=tuple(golden), titles=(title,) if title else (),
                        passages=(text,) if text else ()))
    return hops[:1]


def annotation_of(question: Question) -> Annotation:
    """The hops of `question` by its data set (its `dataset`, else its metadata's)."""
    metadata = question.metadata or {}
    name = (question.dataset or str(metadata.get("dataset") or "")).lower()
    golden = tuple(question.golden_answers)
    if metadata.get("question_decomposition"):
        hops = musique_hops(metadata)
    elif metadata.get("evidences"):
        hops = wiki2_hops(metadata)
    elif "hotpot" in name and metadata.get("supporting_facts"):
        hops = hotpot_hops(metadata)
    elif metadata.get("subj") and metadata.get("prop"):
        hops = popqa_hops(metadata, golden)
    else:
        hops = passage_hops(metadata, question.question, golden)
    return Annotation(question.id, name, question.question, golden, tuple(hops), str(metadata.get("type") or ""))


def read_annotations(paths: Iterable[str]) -> dict[str, Annotation]:
    """Every question's annotation from the questions files, by question id."""
    found: dict[str, Annotation] = {}
    for path in paths:
        for question in load_questions(path):
            found.setdefault(question.id, annotation_of(question))
    return found
