"""Privileged hints for teacher traces (`traces.hint`, which sets `agent.hint` for trace runs only).

A small model sampled as its own teacher rarely writes the query that finds a gold passage, so rejection sampling
keeps few writer rows. STaR (Zelikman et al., 2022) answers this by "rationalization": show the model the answer
as a hint, keep what it then gets right, and train on it without the hint. Here the hint is the titles of the
question's gold passages, and only those the writer's prompt already names (in the question, the knowledge, the
state or the direction) that no search of the question has found yet: the student is taught to name an entity it
can see, never one it would have to guess. The hint is appended to the writer's direction and recorded on the call
(`RoleCall.hint`); `sft-data` trains on the prompt without it (`student_messages`). Evaluation refuses `agent.hint`.
"""

from __future__ import annotations

from collections.abc import Sequence

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.records.evidence import GoldPassage, found
from maps_train.records.metrics import normalize_answer
from maps_train.records.trace import RoleCall, RoundRecord

HINT_SEPARATOR = "\n"  # between the direction and its hint


def searched_ids(rounds: Sequence[RoundRecord]) -> list[str]:
    return [pid for round_ in rounds for hits in round_.retrieved for pid in hits.passage_ids]


def gold_title_hint(gold: Sequence[GoldPassage], visible: str, searched: Sequence[str], passages) -> str | None:
    """The hint for a prompt whose text is `visible`: the titles of `gold` passages not among the `searched` ids
    (by id, else by title and text against `passages`) whose normalised title the normalised prompt holds as whole
    words; None when there is none."""
    seen = f" {normalize_answer(visible)} "
    titles = []
    for passage in gold:
        title = normalize_answer(passage.title)
        if title and f" {title} " in seen and not found(passage, searched, passages):
            titles.append(passage.title)
    titles = list(dict.fromkeys(titles))
    if not titles:
        return None
    named = "; ".join(f'"{title}"' for title in titles)
    return f"Hint: the passages this question needs include the Wikipedia article{'s' if len(titles) > 1 else ''} " \
           f"{named}."


def refuse_hint(hint: str, where: str, why: str) -> None:
    """A one-line error for a run that must not see a hint (an evaluation, RL episodes) with `agent.hint` set."""
    if hint != "none":
        raise ConfigError(f"{where}agent.hint: '{hint}' shows the agent the gold passages' titles, for teacher "
                          f"traces only (traces.hint); {why}")


def student_messages(call: RoleCall, where: str = "call") -> list[dict[str, str]]:
    """The call's messages as the student will see them: without its hint (none: as they are)."""
    if call.hint is None:
        return call.messages
    marked = HINT_SEPARATOR + call.hint
    *head, last = call.messages
    if marked not in last.get("content", ""):
        raise MapsTrainError(f"{where}: the {call.role} call's hint is not in its last message; the trace was edited")
    return [*head, {**last, "content": last["content"].replace(marked, "", 1)}]


__all__ = ["HINT_SEPARATOR", "gold_title_hint", "refuse_hint", "searched_ids", "student_messages"]
