"""Recall@k of the gold supporting passages on the real QA sets (`../shared/realdata`).

Each question's `metadata.supporting_paragraphs[*].corpus_id` is the `id` of a gold passage in
`corpus/corpus.jsonl`; recall@k of a question = share of its gold passages among the top k hits for the question
text, averaged over questions. By default the index covers a SUBSET corpus (so a 2-core machine can embed it): every
paragraph (gold or distractor) of the sampled questions plus the 1,000 `wiki18-` Wikipedia passages.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.evaluate.datasets import DATASETS
from maps_train.questions import Question, load_questions
from maps_train.recipe import RetrievalConfig
from maps_train.retrieval.base import Retriever

# The five open-domain sets, each at its FlashRAG evaluation split as the registry names it.
REALDATA_SETS = ("hotpotqa", "2wikimultihopqa", "musique", "popqa", "nq")
WIKI_PREFIX = "wiki18-"


def sample_questions(realdata: str | Path, per_dataset: int | None, seed: int = 0) -> dict[str, list[Question]]:
    """`per_dataset` questions of each set that have gold passages, a seeded random sample kept in file order."""
    realdata = Path(realdata)
    sampled = {}
    for name in REALDATA_SETS:
        path = DATASETS[name].default_path(name, realdata)
        questions = [q for q in load_questions(path, dataset=name) if gold_ids(q)]
        if per_dataset is not None and per_dataset < len(questions):
            keep = sorted(random.Random(seed).sample(range(len(questions)), per_dataset))
            questions = [questions[i] for i in keep]
        sampled[name] = questions
    return sampled


def gold_ids(question: Question) -> list[str]:
    """Corpus ids of the gold passages; empty when the question has none (about a quarter of NQ)."""
    supporting = question.metadata.get("supporting_paragraphs") or []
    if not isinstance(supporting, list):
        raise MapsTrainError(f"question {question.id} ({question.dataset}): metadata.supporting_paragraphs not a list")
    return [str(p["corpus_id"]) for p in supporting if p.get("corpus_id")]


def write_subset_corpus(corpus: str | Path, questions: list[Question], out_path: str | Path) -> int:
    """Copy (verbatim, in corpus order) the passages of the questions' paragraphs plus the wiki18 passages."""
    wanted = set()
    for question in questions:
        wanted.update(gold_ids(question))
        wanted.update(str(p["corpus_id"]) for p in question.metadata.get("paragraphs", []) if p.get("corpus_id"))
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    partial = out_path.with_name(out_path.name + ".tmp")
    with Path(corpus).open(encoding="utf-8") as source, partial.open("w", encoding="utf-8") as sink:
        for line in source:
            if not line.strip():
                continue
            passage_id = str(json.loads(line)["id"])
            if passage_id in wanted or passage_id.startswith(WIKI_PREFIX):
                sink.write(line if line.endswith("\n") else line + "\n")
                written += 1
    partial.replace(out_path)
    return written


def recall_at(
    retriever: Retriever, questions: list[Question], ks: tuple[int, ...] = (5, 20), batch_size: int = 64
) -> dict[str, Any]:
    """Mean recall@k over the questions that have gold passages; one batched search per `batch_size` questions."""
    scored = [q for q in questions if gold_ids(q)]
    totals = {k: 0.0 for k in ks}
    for start in range(0, len(scored), batch_size):
        batch = scored[start : start + batch_size]
        results = retriever.search([q.question for q in batch], max(ks))
        for question, hits in zip(batch, results):
            gold = set(gold_ids(question))
            for k in ks:
                totals[k] += len(gold & {hit.id for hit in hits[:k]}) / len(gold)
    count = len(scored)
    return {"questions": count, **{f"R@{k}": (totals[k] / count if count else float("nan")) for k in ks}}


def eval_recall(
    realdata: str | Path,
    work_dir: str | Path,
    per_dataset: int | None = 100,
    settings: RetrievalConfig | None = None,
    kinds: tuple[str, ...] = ("dense", "bm25"),
    subset: bool = True,
    seed: int = 0,
    ks: tuple[int, ...] = (5, 20),
) -> list[dict[str, Any]]:
    """Build (or reuse) one index per kind under `work_dir` and score every sampled dataset; returns table rows."""
    from maps_train.retrieval.factory import build_retriever, slug

    realdata, work_dir = Path(realdata), Path(work_dir)
    full_corpus = realdata / "corpus" / "corpus.jsonl"
    sampled = sample_questions(realdata, per_dataset, seed)
    every_question = [q for questions in sampled.values() for q in questions]
    if subset:
        corpus = work_dir / f"subset-{per_dataset}-seed{seed}.jsonl"
        if not corpus.exists():
            write_subset_corpus(full_corpus, every_question, corpus)
    else:
        corpus = full_corpus
    settings = settings or RetrievalConfig()
    rows = []
    for kind in kinds:
        index_dir = work_dir / f"{corpus.stem}-{'bm25' if kind == 'bm25' else slug(settings.encoder)}"
        retriever = build_retriever(replace(settings, corpus=str(corpus), kind=kind, index_dir=str(index_dir)))
        label = "BM25" if kind == "bm25" else f"dense {settings.encoder}"
        passages = len(retriever)
        micro = {"questions": 0, **{f"R@{k}": 0.0 for k in ks}}
        for name, questions in sampled.items():
            scores = recall_at(retriever, questions, ks)
            rows.append({"dataset": name, "retriever": label, "passages": passages, **scores})
            micro["questions"] += scores["questions"]
            for k in ks:
                micro[f"R@{k}"] += scores[f"R@{k}"] * scores["questions"]
        for k in ks:
            micro[f"R@{k}"] /= max(1, micro["questions"])
        rows.append({"dataset": "all (micro)", "retriever": label, "passages": passages, **micro})
    return rows


def format_table(rows: list[dict[str, Any]], ks: tuple[int, ...] = (5, 20)) -> str:
    header = "| dataset | retriever | passages | questions | " + " | ".join(f"R@{k}" for k in ks) + " |"
    lines = [header, "|" + "---|" * 4 + "---:|" * len(ks)]
    for row in rows:
        recalls = " | ".join(f"{row[f'R@{k}']:.3f}" for k in ks)
        lines.append(f"| {row['dataset']} | {row['retriever']} | {row['passages']} | {row['questions']} | {recalls} |")
    return "\n".join(lines)
