"""The reward of one rollout (one question answered by the student), as parts that TRL logs one by one.

`reward_parts` scores a rollout's `TraceRecord` against its `Question`; every part is unweighted, and TRL's
`GRPOConfig.reward_weights` (`reward_weights(config)`) makes the total:
- correctness: Cover-EM (default), EM or F1 of the final answer against the golds, scored as evaluation scores it
  (`records.metrics.score_answer`, FlashRAG's normaliser; choice questions by letter). With Cover-EM a short
  answer of more than `length_guard_words` words scores 0: the gold inside a paragraph would otherwise count.
- format: the share of the trained roles' calls whose output parsed against its schema (`RoleCall.parse_ok`).
- cost: -(cost in `cost_unit`) / `cost_scale`, so lambda (`cost_weight`) multiplies a number <= 0. Each unit is
  the counter evaluation reports: tokens, every prompt and completion token of the question (`Cost`, all roles);
  rounds, the trace's rounds (`AnswerRecord.rounds`); retrievals, the sub-queries searched (`Cost.retrievals`).
- evidence: the share of the question's gold passages among every search hit (`records.evidence`, evaluation's
  `evidence_recall`).

`reward_functions` wraps the parts in TRL's reward-function convention: TRL calls each
`func(prompts=, completions=, completion_ids=, **columns)` and wants one float per completion. The rollout
function hands each rollout's `trace` (a `TraceRecord` or its `to_dict()`) to TRL as an extra field, and its
`question` (a `Question` or its `to_dict()`) comes either as an extra field or as a dataset column (TRL repeats a
dataset row over its G rollouts): a list of each, one per completion, in completion order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import RLRewardConfig
from maps_train.records.evidence import PassageText, evidence_recall, gold_evidence, retrieved_ids
from maps_train.records.metrics import answer_words, score_answer
from maps_train.records.trace import TraceFormatError, TraceRecord

# In the order of `reward_weights`; each is the `__name__` of its reward function, so TRL logs rewards/<part>/mean.
PARTS = ("correctness", "format", "cost", "evidence")


def check_reward_config(config: RLRewardConfig) -> None:
    """The settings the recipe's types do not bound: a cost scale of 0 would divide by zero, a guard of 0 words
    would zero every answer."""
    if not config.cost_scale > 0:
        raise ConfigError(f"rl.reward.cost_scale: must be > 0, got {config.cost_scale}")
    if config.length_guard_words is not None and config.length_guard_words < 1:
        raise ConfigError(f"rl.reward.length_guard_words: must be >= 1 or null, got {config.length_guard_words}")


def answer_mode(question: Question) -> str:
    """"choice" for a question with options (scored by the letter chosen), else "short"; evaluation's rule for a
    data set outside its registry, and the registry's choice set (GPQA) always carries options."""
    return "choice" if question.options else "short"


def correctness(trace: TraceRecord, question: Question, config: RLRewardConfig) -> float:
    """The final answer's score in `config.correctness`; 0 for a guarded Cover-EM answer that is too long."""
    answer = trace.final_answer or ""
    mode = answer_mode(question)
    check_reward_config(config)
    # The guard is for sub-string matching: a letter choice gains nothing from length, so it is left unguarded.
    guarded = config.correctness == "cover_em" and mode == "short" and config.length_guard_words is not None
    if guarded and answer_words(answer) > config.length_guard_words:
        return 0.0
    return float(score_answer(answer, question.golden_answers, mode, question.options)[config.correctness])


def format_share(trace: TraceRecord, trained_roles: Sequence[str]) -> float:
    """Share of the trained roles' calls (the final answer call included) whose output parsed.

    A rollout in which no trained role spoke scores 0, not 1: a policy must not earn the format reward by never
    writing the output the reward is about."""
    calls = [call for call in trace.all_calls() if call.role in trained_roles]
    return sum(call.parse_ok for call in calls) / len(calls) if calls else 0.0


def cost_amount(trace: TraceRecord, unit: str) -> int:
    """The question's cost in `unit`, the same counter evaluation reports for it."""
    if unit == "tokens":
        return trace.cost.prompt_tokens + trace.cost.completion_tokens
    if unit == "rounds":
        return trace.num_rounds
    if unit == "retrievals":
        return trace.cost.retrievals
    raise ConfigError(f"rl.reward.cost_unit: unknown '{unit}' (known: tokens, rounds, retrievals)")


def cost_penalty(trace: TraceRecord, config: RLRewardConfig) -> float:
    """-(cost in `config.cost_unit`) / `config.cost_scale`: never positive, so lambda (cost_weight) >= 0 charges."""
    check_reward_config(config)
    return -cost_amount(trace, config.cost_unit) / config.cost_scale


def evidence(trace: TraceRecord, question: Question, passages: Mapping[str, PassageText] | None = None) -> float:
    """Evidence recall of every search hit; 0 for a question without gold passages (GPQA, some of NQ). That 0 is
    the same for all G rollouts of the question, so it moves no group-relative advantage."""
    recall = evidence_recall(gold_evidence(question.metadata), retrieved_ids(trace), passages)
    return 0.0 if recall is None else recall


def reward_parts(
    trace: TraceRecord,
    question: Question,
    trained_roles: Sequence[str],
    config: RLRewardConfig,
    passages: Mapping[str, PassageText] | None = None,
) -> dict[str, float]:
    """Every part of one rollout's reward, unweighted, keyed by `PARTS`.

    `trained_roles` are trace roles (`RoleCall.role`), not adapters: an adapter trains every role that
    `sft_data.adapter_roles` gives it (the consolidator adapter writes "consolidator" and "answer" calls), e.g.
    `[role for role, adapter in adapter_of_role(recipe).items() if adapter in recipe.rl.roles]`. `passages`
    (passage id -> title and text) is needed only for gold passages known by title and text instead of by id.
    """
    return {
        "correctness": correctness(trace, question, config),
        "format": format_share(trace, trained_roles),
        "cost": cost_penalty(trace, config),
        "evidence": evidence(trace, question, passages),
    }


def reward_weights(config: RLRewardConfig) -> list[float]:
    """TRL's `reward_weights`, in the order of `PARTS` (and of `reward_functions`)."""
    return [config.correctness_weight, config.format_weight, config.cost_weight, config.evidence_weight]


# --- TRL's reward-function convention ------------------------------------------------------------------------------


def _trace_of(value: Any, where: str) -> TraceRecord:
    if isinstance(value, TraceRecord):
        return value
    try:
        return TraceRecord.from_dict(value)
    except TraceFormatError as err:
        raise TraceFormatError(f"{where}: {err}") from None


def _question_of(value: Any, where: str) -> Question:
    if isinstance(value, Question):
        return value
    if not isinstance(value, dict):
        raise MapsTrainError(f"{where}: expected a question (Question.to_dict()), got {type(value).__name__}")
    return Question.from_dict(value, where=where)


def _per_completion(kwargs: dict[str, Any], field: str, count: int, part: str) -> list[Any]:
    """The `field` column TRL passed, checked to hold one entry per completion."""
    values = kwargs.get(field)
    if not isinstance(values, list):
        raise MapsTrainError(
            f"reward {part}: TRL passed no '{field}' list (the rollout function must return one {field} per "
            "rollout as an extra field, or the data set hold it as a column)"
        )
    if len(values) != count:
        raise MapsTrainError(f"reward {part}: {len(values)} entries in '{field}' for {count} completions")
    return values


def rollout_parts(
    traces: Sequence[Any],
    questions: Sequence[Any],
    trained_roles: Sequence[str],
    config: RLRewardConfig,
    passages: Mapping[str, PassageText] | None = None,
) -> list[dict[str, float]]:
    """`reward_parts` of each (trace, question) pair, records or their dicts; a pair whose ids differ is an error
    (a rollout scored against another question's golds would train on noise)."""
    parts = []
    for index, (trace_value, question_value) in enumerate(zip(traces, questions, strict=True)):
        trace = _trace_of(trace_value, f"trace[{index}]")
        question = _question_of(question_value, f"question[{index}]")
        if trace.question_id != question.id:
            raise MapsTrainError(f"trace[{index}]: question_id {trace.question_id!r} is not the id of "
                                 f"question[{index}] ({question.id!r})")
        parts.append(reward_parts(trace, question, trained_roles, config, passages))
    return parts


class RewardPart:
    """One part of the reward as a TRL reward function: `__name__` is the part, so TRL logs it on its own.

    A class instance rather than a closure, so it pickles (TRL's documented reward forms)."""

    def __init__(
        self,
        part: str,
        config: RLRewardConfig,
        trained_roles: Sequence[str],
        passages: Mapping[str, PassageText] | None = None,
    ) -> None:
        if part not in PARTS:
            raise MapsTrainError(f"reward part: unknown '{part}' (known: {', '.join(PARTS)})")
        self.__name__ = part
        self.config = config
        self.trained_roles = list(trained_roles)
        self.passages = passages

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        traces = _per_completion(kwargs, "trace", len(completions), self.__name__)
        questions = _per_completion(kwargs, "question", len(completions), self.__name__)
        parts = rollout_parts(traces, questions, self.trained_roles, self.config, self.passages)
        return [rollout[self.__name__] for rollout in parts]


def reward_functions(
    config: RLRewardConfig,
    trained_roles: Sequence[str],
    passages: Mapping[str, PassageText] | None = None,
) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """GRPOTrainer's `reward_funcs` (one per part, in `PARTS` order) and `GRPOConfig.reward_weights` for them."""
    check_reward_config(config)
    functions = [RewardPart(part, config, trained_roles, passages) for part in PARTS]
    return functions, reward_weights(config)


__all__ = [
    "PARTS", "RewardPart", "answer_mode", "check_reward_config", "correctness", "cost_amount", "cost_penalty",
    "evidence", "format_share", "reward_functions", "reward_parts", "reward_weights", "rollout_parts",
]
