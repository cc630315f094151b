"""Each MAPS role played from the question's annotated hops (`teachers.annotations`), from what its prompt shows
(`teachers.reading`) and nothing else:

- proposer: a direction for each hop not yet resolved whose entity the prompt shows, then the article about that
  entity, then the question as it is asked (padded to N by repetition, which the parser drops);
- writer: the sub-query of its direction: the hop's entity, as the prompt shows it, and the hop's relation; a later
  hop's entity is the earlier hop's answer as the knowledge recorded it, never the annotation's;
- consolidator: the facts of the passages it read that resolve a hop (a passage holding the hop's answer), quoted
  from the passages as shown; sufficient once every hop is resolved;
- answer: the gold answer when the knowledge holds it (or every hop is resolved), else the last answer it holds.

A play returns the role's JSON output, or None where the annotation gives the role nothing to go on (the backend
then falls back: `teachers.backend`). Every query and direction passes `reading.only_shown`, so it names no entity
its prompt does not show.
"""

from __future__ import annotations

from dataclasses import dataclass

from maps_train.agents.outputs import (
    ANSWER_MAX_CHARS,
    DIRECTION_MAX_CHARS,
    OBSERVATION_MAX_CHARS,
    QUERY_MAX_CHARS,
    STATE_MAX_CHARS,
)
from maps_train.teachers.annotations import Annotation, Hop
from maps_train.teachers.reading import Passage, PromptView, holds, only_shown, sentences, shingles, unseen_entities

QUESTION_DIRECTION = "Find passages that answer the question as it is asked."


@dataclass(frozen=True)
class Move:
    direction: str
    query: str
    hop: int | None = None  # the hop it looks for (None: the question itself)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + " ..."


def resolved(annotation: Annotation, knowledge: str) -> dict[int, str]:
    """Hop index -> its answer as `knowledge` writes it, for every hop `knowledge` shows resolved: it holds one of the
    hop's answers, or (a hop resolved by its passage) a run of six words of the passage or the note that it was read."""
    found: dict[int, str] = {}
    grams = shingles(knowledge)
    for index, hop in enumerate(annotation.hops):
        if hop.answers:
            alias = next((answer for answer in hop.answers if holds(knowledge, answer)), None)
            if alias is not None:
                found[index] = alias
        elif hop.titles and (any(shingles(text) & grams for text in hop.passages)
                             or any(holds(knowledge, f"the passage on {title} was read") for title in hop.titles)):
            found[index] = hop.titles[0]
    return found


def entity(annotation: Annotation, index: int, known: dict[int, str], shown: str) -> str | None:
    """The entity hop `index` is about as the prompt shows it: an earlier hop's answer once the knowledge holds it,
    or its own subject where the prompt names it; "" for a hop question that needs none; None: not shown yet."""
    hop = annotation.hops[index]
    if hop.ref is not None:
        return known.get(hop.ref)
    if hop.subject:
        return hop.subject if not unseen_entities(hop.subject, shown) and holds(shown, hop.subject) else None
    return "" if hop.question else None


def _filled(hop: Hop, known: dict[int, str]) -> str:
    text = hop.question or ""
    for index, answer in known.items():
        text = text.replace(f"#{index + 1}", answer)
    return text


def hop_move(annotation: Annotation, index: int, subject: str, known: dict[int, str], shown: str) -> Move:
    hop = annotation.hops[index]
    if hop.question:
        asked = only_shown(_filled(hop, known), shown)
        return Move(_cut(f"Find the answer to: {asked}", DIRECTION_MAX_CHARS), _cut(asked, QUERY_MAX_CHARS), index)
    if hop.relation:
        return Move(_cut(f"Find out the {hop.relation} of {subject}.", DIRECTION_MAX_CHARS),
                    _cut(f"{subject} {hop.relation}", QUERY_MAX_CHARS), index)
    return Move(_cut(f"Find out what the Wikipedia article about {subject} says.", DIRECTION_MAX_CHARS),
                _cut(subject, QUERY_MAX_CHARS), index)


def moves(annotation: Annotation, view: PromptView) -> list[Move]:
    """The round's searches in order: each open hop, the article of each open hop's entity, the question."""
    shown = "\n".join([view.question, view.knowledge])
    known = resolved(annotation, view.knowledge)
    hops, articles = [], []
    for index in range(len(annotation.hops)):
        if index in known:
            continue
        subject = entity(annotation, index, known, shown)
        if subject is None:
            continue
        hops.append(hop_move(annotation, index, subject, known, shown))
        if subject and annotation.hops[index].relation:
            articles.append(Move(_cut(f"Find the Wikipedia article about {subject}.", DIRECTION_MAX_CHARS),
                                 _cut(subject, QUERY_MAX_CHARS), index))
    if not hops:
        return []
    latest = [known[i] for i in sorted(known) if annotation.hops[i].answers]
    if latest:
        question = Move(_cut(f"Find passages that answer the question together with {latest[-1]}.",
                             DIRECTION_MAX_CHARS), _cut(f"{latest[-1]} {view.question}", QUERY_MAX_CHARS))
    else:
        question = Move(QUESTION_DIRECTION, _cut(view.question, QUERY_MAX_CHARS))
    unique: dict[str, Move] = {}
    for move in [*hops, *articles, question]:
        unique.setdefault(move.query.lower(), move)
    return list(unique.values())


def padded(items: list[str], n: int) -> list[str]:
    return [items[i % len(items)] for i in range(n)] if items else []


def propose(annotation: Annotation, view: PromptView) -> dict | None:
    found = moves(annotation, view)
    if not found:
        return None
    return {"directions": padded([move.direction for move in found][: view.num], view.num)}


def write(annotation: Annotation, view: PromptView) -> dict | None:
    """The query of the writer's direction: the move the proposer would have made with it, else the open hop the
    direction's words match best."""
    found = moves(annotation, view)
    if view.direction is None:  # writer_direct: the round's N sub-queries in one call
        return {"queries": padded([move.query for move in found][: view.num], view.num)} if found else None
    direction = view.direction.split("\n\n")[0].strip()
    for move in found:
        if move.direction == direction:
            return {"query": move.query}
    said = set(direction.lower().split())
    scored = [(len(said & set(move.query.lower().split())), -i, move) for i, move in enumerate(found)
              if move.hop is not None]
    if not scored:
        return None
    best = max(scored, key=lambda item: item[:2])[2]
    return {"query": best.query}


def _facts(passage: Passage, hop: Hop, phrase: str, others: list[str]) -> str:
    """The sentences of `passage` (as shown) holding `phrase` (a hop's answer), else one naming another hop's
    entity or a gold answer, else its first."""
    title, text = passage.split(hop.titles)
    body = sentences(text)
    chosen = [s for s in body if phrase and holds(s, phrase)] or [s for s in body if any(holds(s, o) for o in others)]
    text = " ".join((chosen or body[:1])[:2])
    return f"{title}: {text}" if title else text


def statement(annotation: Annotation, index: int, known: dict[int, str], subject: str | None, shown: str) -> str:
    """The hop's fact in one sentence, in words the prompt shows (its relation aside)."""
    hop = annotation.hops[index]
    if not hop.answers:
        return f"The passage on {hop.titles[0]} was read."
    if hop.question:
        return f"{only_shown(_filled(hop, known), shown)} {known[index]}."
    if hop.relation and subject:
        return f"The {hop.relation} of {subject} is {known[index]}."
    return ""


def missing(annotation: Annotation, known: dict[int, str], shown: str) -> str:
    parts = []
    for index, hop in enumerate(annotation.hops):
        if index in known:
            continue
        subject = entity(annotation, index, known, shown)
        if hop.relation and subject:
            parts.append(f"the {hop.relation} of {subject}")
        elif hop.question and subject is not None:
            asked = only_shown(_filled(hop, known), shown).rstrip("?")
            parts.append(asked[:1].lower() + asked[1:])
        elif hop.relation:
            parts.append(f"the {hop.relation} of the entity the step before it finds")
        elif subject:
            parts.append(f"what the article about {subject} says")
    return "; ".join(dict.fromkeys(parts)) or "what the question asks"


def consolidate(annotation: Annotation, view: PromptView) -> dict | None:
    if not annotation.hops:
        return None
    before = resolved(annotation, view.knowledge)
    known = dict(before)
    shown = "\n".join([view.question, view.knowledge] + [p.line for p in view.passages])
    others = [h.subject or "" for h in annotation.hops] + list(annotation.golden_answers)
    facts: list[str] = []
    progress = True
    while progress:  # a hop resolved this round may name the entity of the next one
        progress = False
        for index, hop in enumerate(annotation.hops):
            if index in known:
                continue
            subject = entity(annotation, index, known, shown)
            for passage in view.passages:
                titled = any(passage.has_title(title) for title in hop.titles)
                if hop.answers:
                    alias = next((a for a in hop.answers if holds(passage.line, a)), None)
                    if alias is None or not (titled or (subject and holds(passage.line, subject))):
                        continue
                elif not titled:
                    continue
                else:
                    alias = hop.titles[0]
                known[index] = alias
                facts.append(_facts(passage, hop, alias if hop.answers else "", others))
                said = statement(annotation, index, known, subject, shown)
                if said:
                    facts.append(said)
                progress = True
                break
    done = len(known) == len(annotation.hops)
    if facts:
        observation = " ".join(dict.fromkeys(facts))
    else:
        observation = f"The passages of this round do not establish {missing(annotation, known, shown)}."
    established = [statement(annotation, i, known, entity(annotation, i, known, shown), shown) for i in sorted(known)]
    state = " ".join(s for s in established if s)
    tail = "Every part of the question is established." if done else \
        f"Still missing: {missing(annotation, known, shown)}."
    state = f"{state} {tail}".strip()
    return {"observation": _cut(observation, OBSERVATION_MAX_CHARS), "state": _cut(state, STATE_MAX_CHARS),
            "sufficient": done}


def answer(annotation: Annotation, view: PromptView) -> tuple[dict, bool]:
    """The answer and whether the knowledge supports the gold one (False: the last answer it holds)."""
    knowledge = view.knowledge
    alias = next((a for a in annotation.golden_answers if holds(knowledge, a)), None)
    known = resolved(annotation, knowledge)
    if alias is None and annotation.hops and len(known) == len(annotation.hops) and annotation.golden_answers:
        alias = annotation.golden_answers[0]
    if alias is not None:
        return {"answer": _cut(alias, ANSWER_MAX_CHARS)}, True
    answered = [known[i] for i in sorted(known) if annotation.hops[i].answers]
    return {"answer": _cut(answered[-1], ANSWER_MAX_CHARS) if answered else "unknown"}, False
