"""Gold evidence passages of a question as text ("title\\ntext"), for the analyses that embed them.

The layouts (realdata, FlashRAG MuSiQue, HotpotQA, 2Wiki) are read once, in `maps_train.records.evidence`
(which evaluation's evidence recall reads too). A paragraph known only by its `corpus_id` (the demo world) gets
its text from a corpus when one is given (`passages_by_id`); otherwise it is left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from maps_train.records.evidence import gold_evidence


def gold_passages(metadata: Mapping[str, Any] | None, passages_by_id: Mapping[str, str] | None = None) -> list[str]:
    """The question's gold evidence passages ("title\\ntext"), deduplicated in order; [] when none are known."""
    passages_by_id = passages_by_id or {}
    found = []
    for gold in gold_evidence(metadata):
        passage = gold.formatted() if gold.text else passages_by_id.get(str(gold.corpus_id))
        if passage:
            found.append(passage)
    return list(dict.fromkeys(found))


def gold_corpus_ids(metadata: Mapping[str, Any] | None) -> list[str]:
    """Corpus ids of gold paragraphs that carry no text (looked up in a corpus by the caller)."""
    return [str(gold.corpus_id) for gold in gold_evidence(metadata) if not gold.text]
