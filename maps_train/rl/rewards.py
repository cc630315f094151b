"""The reward of one rollout (one question answered by the student), as parts that TRL logs one by one.

`reward_parts` scores a rollout's `TraceRecord` against its `Question`; every part is unweighted, and TRL's
`GRPOConfig.reward_weights` (`reward_weights(config)`) makes the total:
- correctness: EM (default), F1 or a hedge-proof Cover-EM of the final answer against the golds, scored as
  evaluation scores it (`records.metrics.score_answer`, FlashRAG's normaliser; choice questions by letter). Cover-EM
  here (`strict_cover_em`) matches a gold only on word boundaries ("no" is not in "not known") and scores 0 for an
  answer that hedges: a disjunction ("yes or no", "A or B"), both "yes" and "no", or more than two numbers; and an
  answer of more than `length_guard_words` words scores 0 (the gold inside a paragraph would otherwise count).
- format: whether the branch call's own output parsed against its role's schema (`RoleCall.parse_ok`); without a
  branch call (a trace scored on its own) the share of the trained roles' calls that parsed.
- cost: -(cost in `cost_unit`) / `cost_scale`, so lambda (`cost_weight`) multiplies a number <= 0. Each unit is
  the counter evaluation reports: tokens, every prompt and completion token of the question (`Cost`, all roles);
  rounds, the trace's rounds (`AnswerRecord.rounds`); retrievals, the sub-queries searched (`Cost.retrievals`).
  With `charge_cost: right` (the default) only a right branch (correctness > 0) pays it: a wrong branch cannot
  win its group by being cheap, which is how a cost per token taught the answer call to say "yes".
- evidence: the share of the question's gold passages among every search hit (`records.evidence`, evaluation's
  `evidence_recall`).
- process: the branch call's own credit (`records.credit`, in the trace): a writer's or proposer's share of the
  gold passages its queries found first, a consolidator's right stop-or-continue (1 or 0; a go-on is right only
  when the later rounds found more gold), the answer call's F1; 0 for every branch of a question without gold
  passages (it then moves no advantage). With `process_depth` set, a writer's or proposer's branch call is paid
  its find graded by rank instead (`rank_credit`, written into its credit by `rl.rank_credit` during the
  rollout): the gold no earlier search found, each worth 1 / log2(1 + its best rank) in a search that deep.

TRL's advantages are taken unscaled (`rl.grpo.scale_rewards: none`, maps-train's default): an advantage is a
reward minus its group's mean, in the units above, so branches that differ by a few tokens of cost get advantages
of a few thousandths of lambda, not of one.

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
from maps_train.records.credit import call_credits
from maps_train.records.evidence import PassageText, evidence_recall, gold_evidence, retrieved_ids
from maps_train.records.metrics import answer_words, normalize_answer, scorable_golds, score_answer
from maps_train.records.trace import RoleCall, TraceFormatError, TraceRecord

RANK_CREDIT = "rank_credit"  # a search call's credit entry: its find graded by rank (`rl.rank_credit`)

# In the order of `reward_weights`; each is the `__name__` of its reward function, so TRL logs rewards/<part>/mean.
PARTS = ("correctness", "format", "cost", "evidence", "process")


def answer_mode(question: Question) -> str:
    """"choice" for a question with options (scored by the letter chosen), else "short"; evaluation's rule for a
    data set outside its registry, and the registry's choice set (GPQA) always carries options."""
    return "choice" if question.options else "short"


HEDGE_WORDS = {"or", "either", "nor"}


def hedges(answer: str) -> bool:
    """Whether a short answer names more than one candidate: a disjunction, both "yes" and "no", or more than two
    numbers ("3 March 1990" is one date; "1 2 3 4 5 6 7 8 9" is a list)."""
    words = normalize_answer(answer).split()
    numbers = {word for word in words if word.isdigit()}
    return bool(HEDGE_WORDS & set(words)) or {"yes", "no"} <= set(words) or len(numbers) > 2


def strict_cover_em(answer: str, golden_answers: Sequence[str]) -> float:
    """Cover-EM for training: a normalised gold inside the normalised answer on word boundaries, 0 for a hedge."""
    if hedges(answer):
        return 0.0
    text = f" {normalize_answer(answer)} "
    return 1.0 if any(f" {gold} " in text for gold in scorable_golds(golden_answers)) else 0.0


def correctness(trace: TraceRecord, question: Question, config: RLRewardConfig) -> float:
    """The final answer's score in `config.correctness`; 0 for a guarded Cover-EM answer that is too long."""
    answer = trace.final_answer or ""
    mode = answer_mode(question)
    scores = score_answer(answer, question.golden_answers, mode, question.options)
    if mode == "choice" or config.correctness != "cover_em":
        return float(scores[config.correctness])  # a letter choice gains nothing from length or hedging
    if config.length_guard_words is not None and answer_words(answer) > config.length_guard_words:
        return 0.0
    return strict_cover_em(answer, question.golden_answers)


def trained_calls(trace: TraceRecord, trained_roles: Sequence[str]) -> list[tuple[RoleCall, dict[str, Any] | None]]:
    """The trained roles' calls of `trace` with their credit, in call order (the branch call is the b-th)."""
    return [(call, credit) for call, credit in call_credits(trace) if call.role in trained_roles]


def branch_of(trace: TraceRecord, trained_roles: Sequence[str],
              branch_call: int | None) -> tuple[RoleCall, dict[str, Any] | None] | None:
    """The branch call of a rollout (its b-th trained call) with its credit; None without a branch call."""
    if branch_call is None:
        return None
    calls = trained_calls(trace, trained_roles)
    if not 0 <= branch_call < len(calls):
        raise MapsTrainError(f"trace {trace.question_id}: branch call {branch_call} of {len(calls)} trained calls")
    return calls[branch_call]


def format_share(trace: TraceRecord, trained_roles: Sequence[str], branch_call: int | None = None) -> float:
    """Whether the branch call parsed; without one, the share of the trained roles' calls (the final answer call
    included) whose output parsed.

    A rollout in which no trained role spoke scores 0, not 1: a policy must not earn the format reward by never
    writing the output the reward is about."""
    branch = branch_of(trace, trained_roles, branch_call)
    if branch is not None:
        return float(branch[0].parse_ok)
    calls = [call for call in trace.all_calls() if call.role in trained_roles]
    return sum(call.parse_ok for call in calls) / len(calls) if calls else 0.0


def call_process_credit(call: RoleCall, credit: dict[str, Any] | None, gold: int, ranked: bool = False) -> float:
    """One call's process reward from its credit (see the module docstring); 0 when it cannot be judged.
    `ranked`: a search call's rank-graded find where the rollout wrote one (`rl.reward.process_depth`)."""
    if credit is None:
        return 0.0
    if call.role == "answer":
        return float(credit.get("f1", 0.0))
    if gold <= 0:
        return 0.0
    if ranked and RANK_CREDIT in credit:
        return float(credit[RANK_CREDIT])
    if "new" in credit:
        return min(1.0, int(credit["new"]) / gold)
    if "right" in credit:
        return 1.0 if credit["right"] is True else 0.0
    return 0.0


def process(trace: TraceRecord, trained_roles: Sequence[str], branch_call: int | None = None,
            ranked: bool = False) -> float:
    """The branch call's credit; without one, the mean over the trained roles' calls."""
    gold = int((trace.credit or {}).get("gold", 0))
    branch = branch_of(trace, trained_roles, branch_call)
    if branch is not None:
        return call_process_credit(branch[0], branch[1], gold, ranked)
    calls = trained_calls(trace, trained_roles)
    return sum(call_process_credit(call, credit, gold, ranked) for call, credit in calls) / len(calls) if calls else 0.0


def cost_amount(trace: TraceRecord, unit: str) -> int:
    """The question's cost in `unit`, the same counter evaluation reports for it."""
    if unit == "tokens":
        return trace.cost.prompt_tokens + trace.cost.completion_tokens
    if unit == "rounds":
        return trace.num_rounds
    if unit == "retrievals":
        return trace.cost.retrievals
    raise ConfigError(f"rl.reward.cost_unit: unknown '{unit}' (known: tokens, rounds, retrievals)")


def cost_penalty(trace: TraceRecord, config: RLRewardConfig, right: bool = True) -> float:
    """-(cost in `config.cost_unit`) / `config.cost_scale`: never positive, so lambda (cost_weight) >= 0 charges.
    With `charge_cost: right`, a wrong branch (`right` false) pays nothing."""
    if config.charge_cost == "right" and not right:
        return 0.0
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
    branch_call: int | None = None,
) -> dict[str, float]:
    """Every part of one rollout's reward, unweighted, keyed by `PARTS`; `branch_call`: which of the trained
    roles' calls the rollout sampled afresh (`rl.rollout.Rollout.branch_call`), None for a trace on its own.

    `trained_roles` are trace roles (`RoleCall.role`), not adapters: an adapter trains every role that
    `sft_data.adapter_roles` gives it (the consolidator adapter writes "consolidator" and "answer" calls), e.g.
    `[role for role, adapter in adapter_of_role(recipe).items() if adapter in recipe.rl.roles]`. `passages`
    (passage id -> title and text) is needed only for gold passages known by title and text instead of by id.
    """
    right = correctness(trace, question, config)
    return {
        "correctness": right,
        "format": format_share(trace, trained_roles, branch_call),
        "cost": cost_penalty(trace, config, right > 0),
        "evidence": evidence(trace, question, passages),
        "process": process(trace, trained_roles, branch_call, ranked=config.process_depth is not None),
    }


def reward_weights(config: RLRewardConfig) -> list[float]:
    """TRL's `reward_weights`, in the order of `PARTS` (and of `reward_functions`)."""
    return [config.correctness_weight, config.format_weight, config.cost_weight, config.evidence_weight,
            config.process_weight]


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
    branch_calls: Sequence[int | None] | None = None,
) -> list[dict[str, float]]:
    """`reward_parts` of each (trace, question) pair, records or their dicts; a pair whose ids differ is an error
    (a rollout scored against another question's golds would train on noise)."""
    parts = []
    branch_calls = list(branch_calls) if branch_calls is not None else [None] * len(traces)
    for index, (trace_value, question_value) in enumerate(zip(traces, questions, strict=True)):
        trace = _trace_of(trace_value, f"trace[{index}]")
        question = _question_of(question_value, f"question[{index}]")
        if trace.question_id != question.id:
            raise MapsTrainError(f"trace[{index}]: question_id {trace.question_id!r} is not the id of "
                                 f"question[{index}] ({question.id!r})")
        parts.append(reward_parts(trace, question, trained_roles, config, passages, branch_calls[index]))
    return parts


class PartsOnce:
    """Every part of a batch's rollouts, computed once: TRL calls each part's function with the same rollout
    lists (`_calculate_rewards` builds its keyword lists once a batch), and the parts share one computation, kept
    while TRL passes the very same trace list (held here, so its identity cannot pass to a later batch's list)."""

    def __init__(self, config: RLRewardConfig, trained_roles: Sequence[str],
                 passages: Mapping[str, PassageText] | None = None):
        self.config = config
        self.trained_roles = list(trained_roles)
        self.passages = passages
        self._traces: list[Any] | None = None
        self._parts: list[dict[str, float]] = []
        self.computed = 0  # batches computed (tests)

    def __call__(self, count: int, kwargs: dict[str, Any], part: str) -> list[dict[str, float]]:
        traces = _per_completion(kwargs, "trace", count, part)
        questions = _per_completion(kwargs, "question", count, part)
        branch_calls = kwargs.get("branch_call")
        if branch_calls is not None:
            branch_calls = _per_completion(kwargs, "branch_call", count, part)
        if traces is not self._traces:
            self._parts = rollout_parts(traces, questions, self.trained_roles, self.config, self.passages,
                                        branch_calls)
            self._traces = traces
            self.computed += 1
        return self._parts


class RewardPart:
    """One part of the reward as a TRL reward function: `__name__` is the part, so TRL logs it on its own.

    A class instance rather than a closure, so it pickles (TRL's documented reward forms)."""

    def __init__(
        self,
        part: str,
        config: RLRewardConfig,
        trained_roles: Sequence[str],
        passages: Mapping[str, PassageText] | None = None,
        shared: PartsOnce | None = None,
    ) -> None:
        if part not in PARTS:
            raise MapsTrainError(f"reward part: unknown '{part}' (known: {', '.join(PARTS)})")
        self.__name__ = part
        self.shared = shared or PartsOnce(config, trained_roles, passages)

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        return [rollout[self.__name__] for rollout in self.shared(len(completions), kwargs, self.__name__)]


def reward_functions(
    config: RLRewardConfig,
    trained_roles: Sequence[str],
    passages: Mapping[str, PassageText] | None = None,
) -> list[Callable[..., list[float]]]:
    """GRPOTrainer's `reward_funcs`, one per part in `PARTS` order (their weights: `reward_weights`)."""
    shared = PartsOnce(config, trained_roles, passages)
    return [RewardPart(part, config, trained_roles, passages, shared) for part in PARTS]


__all__ = [
    "PARTS", "PartsOnce", "RewardPart", "answer_mode", "correctness", "cost_amount",
    "cost_penalty", "evidence", "format_share", "hedges", "process", "reward_functions", "reward_parts",
    "reward_weights", "rollout_parts", "strict_cover_em",
]
