"""Vanilla RAG (FlashRAG's sequential pipeline): retrieve top-K passages for the question, answer once.

A batch is one retriever call (every question's top-K) and one backend call (role "generator"). The trace has one
round holding the retrieval; the generator call is the final call, its reply (bounded, thinking removed) the answer.
"""

from __future__ import annotations

from functools import partial

from maps_train.agents.baselines.answers import extract_direct_answer
from maps_train.agents.baselines.base import BaselineEngine
from maps_train.agents.engine import PendingCall, QuestionRun
from maps_train.agents.jsonparse import Parsed, has_content
from maps_train.agents.prompt_context import format_question, passages_slot
from maps_train.agents.registry import register_method
from maps_train.questions import Question
from maps_train.records.trace import SubQueryHits, TraceRecord

PROMPT = "baselines/vanilla_generator"


def parse_direct(text: str, letters: list[str] | None) -> Parsed:
    """The generator's answer; ok when one was found and it says something (a letter or digit: "-" or "..." is a
    placeholder, not an answer)."""
    answer, how = extract_direct_answer(text, letters)
    if how == "none" or not has_content(answer):
        return Parsed({"answer": answer, "format": how}, ok=False, error=f"no answer found ({how})")
    return Parsed({"answer": answer, "format": how}, ok=True)


@register_method("vanilla")
class VanillaRAGEngine(BaselineEngine):
    roles = ("generator",)  # the routes its calls take

    def prompt_names(self) -> list[str]:
        return [PROMPT, "baselines/answer_direct_short", "baselines/answer_direct_choice"]

    def run_batch(self, questions: list[Question]) -> list[TraceRecord]:
        runs = [QuestionRun(question=q) for q in questions]
        requests = [(run, run.question.question) for run in runs]
        hit_lists = self.search(requests, self.agent.top_k)
        plans = []
        for run, hits in zip(runs, hit_lists):
            round_ = run.start_round()
            round_.sub_queries = [run.question.question]
            round_.retrieved = [SubQueryHits(query=run.question.question, passage_ids=[h.id for h in hits])]
            round_.evidence_ids = [h.id for h in hits]
            letters = self.letters(run.question)
            messages, shrink = self.prompts.render_shrinkable(
                PROMPT,
                passages=passages_slot(hits, self.agent.max_passage_words),
                question=format_question(run.question),
                answer_format=self.answer_format("direct", letters),
            )
            plans.append(
                PendingCall(
                    run=run,
                    role="generator",
                    messages=messages,
                    parse=partial(parse_direct, letters=letters),
                    shrink=shrink,
                )
            )
        for plan, (call, parsed) in zip(plans, self.call_roles(plans)):
            plan.run.final_call = call
            plan.run.final_answer = parsed.value["answer"]
            plan.run.stop_reason = "answered"
        return [run.to_trace(self.method, self.config_digest) for run in runs]
