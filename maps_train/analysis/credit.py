"""Credit per role over traces (`records.credit`): what each role's calls contributed, per file.

For a traces file (a run, a sample of `maps-train traces`, an eval system's run): per role, the calls that could be
judged (their question names gold passages), and
- writer and proposer: the share of calls whose queries found gold no earlier search had, and the mean number new;
- consolidator: the share of right stop-or-continue decisions, and how the wrong ones went (stopped with gold
  missing, went on with every gold passage found, went on with gold missing and no later round found more);
- answer: mean EM and F1.
A trace written before credit was recorded is counted under `no credit` and judged nowhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from maps_train.analysis.trace_reader import iter_valid_traces
from maps_train.records.credit import call_credits


def credit_summary(path: str | Path) -> dict[str, Any]:
    """The per-role credit of every trace in `path` (see the module docstring)."""
    roles: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    traces = uncredited = 0
    for trace in iter_valid_traces(path):
        traces += 1
        if trace.credit is None:
            uncredited += 1
            continue
        gold = int(trace.credit.get("gold", 0))
        for call, credit in call_credits(trace):
            counts = roles[call.role]
            counts["calls"] += 1
            if credit is None:
                continue
            if call.role == "answer":
                counts["judged"] += 1
                counts["em"] += float(credit.get("em", 0.0))
                counts["f1"] += float(credit.get("f1", 0.0))
            elif gold and "new" in credit:
                counts["judged"] += 1
                counts["found_new"] += int(credit["new"]) > 0
                counts["new"] += int(credit["new"])
            elif gold and credit.get("right") is not None:
                counts["judged"] += 1
                counts["right"] += bool(credit["right"])
                counts["stopped_missing"] += bool(credit["stopped"]) and not credit["complete"]
                counts["went_on_complete"] += (not credit["stopped"]) and bool(credit["complete"])
                counts["went_on_futile"] += ((not credit["stopped"]) and not credit["complete"]
                                             and int(credit.get("later_new", 1)) == 0)
    return {"traces": traces, "no_credit": uncredited, "roles": {role: dict(c) for role, c in sorted(roles.items())}}


def _share(counts: dict[str, float], key: str) -> str:
    judged = counts.get("judged", 0)
    return f"{100 * counts.get(key, 0) / judged:.1f}" if judged else "-"


def credit_markdown(summaries: Iterable[tuple[str, dict[str, Any]]]) -> str:
    lines = ["| traces | role | calls | judged | found new gold (%) | new gold / call | right decision (%) | "
             "stopped with gold missing (%) | went on with all found (%) | went on, found no more (%) | EM | F1 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, summary in summaries:
        for role, c in summary["roles"].items():
            judged = c.get("judged", 0)
            search = role in ("writer", "proposer")
            decision = role == "consolidator"
            answer = role == "answer"
            per_call = f"{c.get('new', 0) / judged:.2f}" if search and judged else "-"
            lines.append(
                f"| {name} | {role} | {int(c.get('calls', 0))} | {int(judged)} | "
                f"{_share(c, 'found_new') if search else '-'} | "
                f"{per_call} | "
                f"{_share(c, 'right') if decision else '-'} | {_share(c, 'stopped_missing') if decision else '-'} | "
                f"{_share(c, 'went_on_complete') if decision else '-'} | "
                f"{_share(c, 'went_on_futile') if decision else '-'} | "
                f"{_share(c, 'em') if answer else '-'} | {_share(c, 'f1') if answer else '-'} |")
    return "\n".join(lines)


__all__ = ["credit_markdown", "credit_summary"]
