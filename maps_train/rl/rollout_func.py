"""TRL's `rollout_func` for MAPS: each group of G identical prompts (a question id) played as G branch rollouts
(`maps_train.rl.rollout`), with the episodes' metrics logged beside TRL's own."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from maps_train.adapters import AdapterSet
from maps_train.errors import MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import Recipe
from maps_train.records.metrics import score_answer
from maps_train.rl.environment import environment_recipe
from maps_train.rl.layout import adapter_name
from maps_train.rl.policy import ModelSampler, PolicyBackend, Sampler, Sampling
from maps_train.rl.rewards import answer_mode
from maps_train.rl.rollout import BranchRollouts, policy_router
from maps_train.train import internals

logger = logging.getLogger(__name__)

class MapsRollouts:
    """TRL's `rollout_func(prompts, trainer)`: each group of G identical prompts (a question id) becomes G branch
    rollouts; returns the branch calls' tokens and, as extra fields TRL hands the reward functions, each
    rollout's trace and question. The policy backend is built on the first call, from the trainer TRL passes; the
    calls the policy does not answer go to the environment `environment_recipe(recipe, adapters)` (`rl.environment`),
    from the very adapter set the policy started from."""

    def __init__(self, recipe: Recipe, role: str, questions: Mapping[str, Question], retriever: Any,
                 trained_roles: list[str], adapters: AdapterSet,
                 environment_backends: Mapping[str, Any] | None = None):
        self.recipe = recipe
        self.role = role
        self.adapters = adapters
        self.questions = questions
        self.retriever = retriever
        self.environment_backends = environment_backends
        self.trained_roles = trained_roles
        self.rollouts: BranchRollouts | None = None

    def _build(self, trainer) -> BranchRollouts:
        rl = self.recipe.rl
        sampling = Sampling(temperature=rl.temperature, max_tokens=rl.max_completion_tokens, top_p=trainer.args.top_p)
        if rl.rollout == "vllm":
            from maps_train.rl.vllm_policy import VLLMSampler

            sampler: Sampler = VLLMSampler(internals.trl_generation(trainer), list(trainer.eos_token_ids))
        else:
            sampler = ModelSampler(lambda: trainer.accelerator.unwrap_model(trainer.model), trainer.processing_class)
        policy = PolicyBackend(sampler, trainer.processing_class, sampling, self.recipe.backend.max_model_len,
                               self.recipe.backend.truncate_prompt, adapter_name(self.recipe, self.role), rl.decoding)
        environment = environment_recipe(self.recipe, self.adapters)
        router = policy_router(environment, self.trained_roles, policy, self.environment_backends)
        return BranchRollouts(environment, router, policy, self.retriever, self.trained_roles,
                              rl.num_generations, rl.seed, rl.reward_for(self.role).process_depth)

    def close(self) -> None:
        """Free the environment engines this role's router started (the next role builds its own)."""
        if self.rollouts is not None:
            self.rollouts.router.close()

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        if self.rollouts is None:
            self.rollouts = self._build(trainer)
        questions = self._group_questions(prompts)
        logger.info("rl rollout: rank %d/%d step %d: questions %s", trainer.accelerator.process_index,
                    trainer.accelerator.num_processes, trainer.state.global_step, ",".join(q.id for q in questions))
        rollouts = self.rollouts.run(questions, trainer.state.global_step)
        log_episode_metrics(trainer, rollouts)
        return {
            "prompt_ids": [r.sample.prompt_ids for r in rollouts],
            "completion_ids": [r.sample.completion_ids for r in rollouts],
            "logprobs": [r.sample.logprobs for r in rollouts],
            "trace": [r.trace.to_dict() for r in rollouts],
            "question": [r.question.to_dict() for r in rollouts],
            "branch_call": [r.branch_call for r in rollouts],  # the process and format parts score this call
        }

    def _group_questions(self, prompts: list[str]) -> list[Question]:
        """The questions of TRL's groups: G consecutive identical prompts each (the RepeatSampler's order)."""
        g = self.recipe.rl.num_generations
        groups = [prompts[i : i + g] for i in range(0, len(prompts), g)]
        if any(len(set(group)) != 1 or len(group) != g for group in groups):
            raise MapsTrainError(f"rl rollout: TRL's prompts do not come in groups of {g} identical ones; "
                                 "rl.grpo's batch sizes must hold whole groups per process")
        return [self.questions[group[0]] for group in groups]


def log_episode_metrics(trainer, rollouts) -> None:
    """Cover-EM and cost per question of this step's episodes, in TRL's own metrics (averaged per logging step)."""
    if not rollouts:
        return
    n = len(rollouts)
    cover_em = sum(score_answer(r.trace.final_answer or "", r.question.golden_answers, answer_mode(r.question),
                                r.question.options)["cover_em"] for r in rollouts) / n
    internals.log_metric(trainer, "episode/cover_em", cover_em)
    internals.log_metric(trainer, "episode/tokens", sum(r.trace.cost.prompt_tokens + r.trace.cost.completion_tokens
                                              for r in rollouts) / n)
    internals.log_metric(trainer, "episode/rounds", sum(r.trace.num_rounds for r in rollouts) / n)
    internals.log_metric(trainer, "episode/retrievals", sum(r.trace.cost.retrievals for r in rollouts) / n)
