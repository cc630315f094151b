"""Evidence recall by round: how much of each question's gold evidence a system has found after its t-th search.

For every traced question with gold passages (`maps_train.records.evidence`: layouts and matching), the recall
after retrieval round t counts every hit of the question's first t rounds that searched (the meaning of "round"
the stop-round analysis uses, the same for every method: a Search-o1 turn that answered is no round). A question
that stopped before round t keeps what it had found, so each curve is over a fixed set of questions and rises
only when searching on finds more; `searching` says how many questions were still searching at round t.

Traces keep passage ids only: gold passages that carry a corpus id are matched by id; the others (FlashRAG's own
HotpotQA/2Wiki/MuSiQue files) by title and text, read from `--corpus` when it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from maps_train.analysis.report import write_table
from maps_train.analysis.runs import QuestionIndex, RunFolder
from maps_train.analysis.sections import Written
from maps_train.analysis.trace_reader import read_traces
from maps_train.plotting import pyplot
from maps_train.records.evidence import GoldPassage, PassageText, evidence_recall, gold_evidence, needs_passage_text
from maps_train.records.trace import TraceRecord
from maps_train.retrieval.corpus import PassageLookup


@dataclass
class EvidenceByRound:
    system: str
    curves: list[list[float]] = field(default_factory=list)  # per question: recall after rounds 1..its last

    @property
    def questions(self) -> int:
        return len(self.curves)

    @property
    def max_round(self) -> int:
        return max((len(c) for c in self.curves), default=0)

    def recall_at(self, round_: int) -> float | None:
        """Mean recall after `round_` (1-based), a question that stopped earlier holding its last value."""
        values = [c[min(round_, len(c)) - 1] for c in self.curves if c]
        return fmean(values) if values else None

    def searching_at(self, round_: int) -> int:
        return sum(1 for c in self.curves if len(c) >= round_)


def recall_curve(trace: TraceRecord, gold: list[GoldPassage], passages: dict[str, PassageText]) -> list[float]:
    """Recall after each round that searched (cumulative); [] for a question that never searched."""
    found: list[str] = []
    curve = []
    for round_ in trace.rounds:
        if not round_.retrieved:
            continue
        found.extend(pid for hits in round_.retrieved for pid in hits.passage_ids)
        curve.append(evidence_recall(gold, found, passages) or 0.0)
    return curve


def evidence_by_round(
    runs: list[RunFolder], index: QuestionIndex, corpus: str | Path | None = None
) -> list[EvidenceByRound]:
    """Per system (in the order met), the recall curves of its traced questions that have gold passages."""
    by_system: dict[str, EvidenceByRound] = {}
    lookup = PassageLookup(corpus) if corpus is not None else None  # one read of the corpus for all the runs
    for run in runs:
        if not run.traces.is_file():
            continue
        traces = read_traces(run.traces)
        metadata = index.metadata(run, [t.question_id for t in traces])
        golds = {t.question_id: gold_evidence(metadata.get(t.question_id)) for t in traces}
        wanted = {
            pid for t in traces if needs_passage_text(golds[t.question_id])
            for r in t.rounds for hits in r.retrieved for pid in hits.passage_ids
        }
        passages = lookup(wanted) if lookup is not None else {}
        stats = by_system.setdefault(run.system, EvidenceByRound(run.system))
        for trace in traces:
            if golds[trace.question_id]:
                stats.curves.append(recall_curve(trace, golds[trace.question_id], passages))
    if lookup is not None:
        lookup.close()
    return [s for s in by_system.values() if s.questions]


def evidence_rows(stats: list[EvidenceByRound]) -> list[dict[str, Any]]:
    rows = []
    for s in stats:
        for round_ in range(1, s.max_round + 1):
            rows.append({"system": s.system, "round": round_, "evidence_recall": s.recall_at(round_),
                         "searching": s.searching_at(round_), "questions": s.questions})
    return rows


def evidence_markdown(stats: list[EvidenceByRound]) -> str:
    if not stats:
        return "No traced question has gold passages (give --questions FILE or --data-root DIR).\n"
    rounds = range(1, max(s.max_round for s in stats) + 1)
    lines = ["| System | Questions | " + " | ".join(f"round {r}" for r in rounds) + " |",
             "|---|---:|" + "---:|" * len(rounds)]
    for s in stats:
        cells = []
        for r in rounds:
            recall = s.recall_at(r)
            cells.append("-" if recall is None else f"{100 * recall:.1f} ({s.searching_at(r)})")
        lines.append(f"| {s.system} | {s.questions} | " + " | ".join(cells) + " |")
    note = ("Evidence recall x 100 after each retrieval round (every hit so far; a question that stopped keeps what "
            "it found); in brackets, the questions still searching at that round.")
    return note + "\n\n" + "\n".join(lines) + "\n"


def plot_evidence(stats: list[EvidenceByRound], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for s in stats:
        rounds = list(range(1, s.max_round + 1))
        ax.plot(rounds, [100 * (s.recall_at(r) or 0.0) for r in rounds], marker="o", label=s.system)
    if stats:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no gold passages", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("retrieval round")
    ax.set_ylabel("evidence recall x 100")
    ax.set_title("Evidence recall by round")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_evidence(out: Path, stats: list[EvidenceByRound]) -> Written:
    rows, markdown = evidence_rows(stats), evidence_markdown(stats)
    files = write_table(out, "evidence", rows, markdown)
    return Written("evidence", rows, markdown, files, plot_evidence(stats, out / "evidence.png"))


__all__ = ["EvidenceByRound", "evidence_by_round", "evidence_markdown", "evidence_rows", "recall_curve",
           "write_evidence"]
