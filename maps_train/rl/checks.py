"""What the recipe's types do not bound about an RL run, checked before any model loads."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from maps_train.config.typed import did_you_mean
from maps_train.errors import ConfigError
from maps_train.library_options import GRPOOptions, check_library_sections
from maps_train.recipe import Recipe, adapter_of_role, route_for
from maps_train.records.hints import refuse_hint
from maps_train.rl.environment import environment_recipe
from maps_train.rl.layout import launched_world_size
from maps_train.rl.rollout import trained_trace_roles
from maps_train.rl.vllm_policy import SERVER_TAKES_NO_SCHEMA


def check_rl_config(recipe: Recipe) -> None:
    """What the recipe's types do not bound, before any model loads."""
    check_library_sections(recipe, "rl")  # rl.grpo (and train.lora) by TRL and PEFT
    rl = recipe.rl
    if rl.rollout == "vllm":
        check_vllm_rollout(GRPOOptions.of(rl.grpo))
        check_deployed_on_vllm(recipe)
    refuse_hint(recipe.agent.hint, "", "RL episodes must run as deployed")
    if not rl.roles:
        raise ConfigError("rl.roles: name at least one role to train (proposer, writer, consolidator)")
    for field, other in (("train.output_dir", recipe.train.output_dir), ("rl.adapters_dir", rl.adapters_dir)):
        if other and Path(rl.output_dir).expanduser().resolve() == Path(other).expanduser().resolve():
            raise ConfigError(f"rl.output_dir: {rl.output_dir} is {field}, another stage's folder (its checkpoints "
                              "would be resumed and its adapters overwritten); give rl a folder of its own")
    roles = adapter_of_role(recipe)
    adapters = [roles.get(role) for role in rl.roles]
    if len(set(adapters)) != len(adapters):
        raise ConfigError(f"rl.roles: {rl.roles} train one adapter twice ({', '.join(map(str, adapters))})")
    for role in rl.roles:
        trained_trace_roles(recipe, role)
    # A role that this run does not train keeps its entry for the run that does (a recipe's roles are often RL'd one
    # at a time, `rl.roles=[writer]`); a name that is no role at all is a typo that would price nothing.
    for role in rl.role_reward:
        if role not in roles:
            raise ConfigError(f"rl.role_reward.{role}: no role of sft_data.adapter_roles{did_you_mean(role, roles)} "
                              f"({', '.join(sorted(roles))}); its reward would price nothing")
    for role in rl.roles:
        depth = rl.reward_for(role).process_depth
        if depth is not None and depth < recipe.agent.top_k:
            raise ConfigError(f"rl.reward.process_depth ({role}): {depth} is shallower than the agent's own search "
                              f"(agent.top_k: {recipe.agent.top_k}); a find there would be paid nothing")
    if rl.decisions == "both" and (rl.decoding != "deployed" or rl.num_generations % 2):
        raise ConfigError(f"rl.decisions: 'both' fixes the decision by the role's grammar in half the branches: it "
                          f"needs rl.decoding: deployed and an even rl.num_generations (got {rl.decoding}, "
                          f"{rl.num_generations})")
    check_environment_per_rank(recipe, launched_world_size())
    if not rl.temperature > 0:
        raise ConfigError(f"rl.temperature: GRPO samples its rollouts, so it must be > 0, got {rl.temperature}")
    check_grpo_numbers(rl.grpo)
    check_completion_fits(recipe)
    for line in rl_warnings(recipe):
        print(f"maps-train: warning: {line}", file=sys.stderr)
    grpo = GRPOOptions.of(rl.grpo)
    batch = grpo.per_device_train_batch_size * grpo.gradient_accumulation_steps
    if batch % rl.num_generations:
        raise ConfigError(f"rl.grpo.per_device_train_batch_size x gradient_accumulation_steps ({batch}) must be a "
                          f"multiple of rl.num_generations ({rl.num_generations}): each process rolls out whole groups")


def rl_warnings(recipe: Recipe) -> list[str]:
    """Settings this run never uses, each a line: a role's reward when the role is not trained here (kept for the
    run that trains it, so a warning, not an error), `rl.decisions: both` when no trained adapter answers the
    consolidator (the only yes/no decision it fixes)."""
    rl = recipe.rl
    lines = [f"rl.role_reward.{role}: rl.roles ({', '.join(rl.roles)}) does not train {role}; its reward applies "
             f"only to a run that does" for role in rl.role_reward if role not in rl.roles]
    if rl.decisions == "both" and "consolidator" not in rl.roles:
        lines.append(f"rl.decisions: 'both' fixes the consolidator's stop-or-continue, and rl.roles "
                     f"({', '.join(rl.roles)}) does not train the consolidator: it changes nothing in this run")
    return lines


def check_completion_fits(recipe: Recipe) -> None:
    """A trained call's completion must leave room for its prompt in the context (backend.max_model_len)."""
    tokens, context = recipe.rl.max_completion_tokens, recipe.backend.max_model_len
    if tokens >= context:
        raise ConfigError(f"rl.max_completion_tokens: {tokens} does not fit the context with a prompt "
                          f"(backend.max_model_len: {context}); give it fewer than {context} tokens")


def check_grpo_numbers(grpo: Mapping[str, Any]) -> None:
    """rl.grpo's numbers as numbers, before TRL sees them: a NaN learning rate or a zero batch ended in tracebacks
    deep in the Trainer, a negative beta trained away from the reference."""
    for key, least, open_low in (("learning_rate", 0.0, True), ("beta", 0.0, False)):
        value = grpo.get(key)
        if value is None:
            continue
        finite = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not finite or value < least or (open_low and value == least):
            raise ConfigError(f"rl.grpo.{key}: must be a finite number {'>' if open_low else '>='} {least:g}, "
                              f"got {value!r}")
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if key not in grpo:
            continue  # TRL's default
        value = grpo[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"rl.grpo.{key}: must be an integer >= 1, got {value!r}")
    save = grpo.get("save_steps")
    if save is not None:  # TRL: a step count >= 1, or a float below 1 as a share of the run's steps
        number = isinstance(save, int | float) and not isinstance(save, bool) and math.isfinite(save)
        if not number or save <= 0 or (save >= 1 and save != int(save)):
            raise ConfigError(f"rl.grpo.save_steps: must be an integer >= 1 (a checkpoint every so many steps) or a "
                              f"share of the steps in (0, 1), got {save!r}")


def check_environment_per_rank(recipe: Recipe, world_size: int) -> None:
    """Every rank builds the environment of its own episodes, and an in-process vLLM engine takes GPUs 0..tp-1
    (`llm.pool`): with several ranks every rank's engine would start on GPU 0. Served adapters (server), hf routes
    (on the rank's own device) and remote routes are per rank as they should be."""
    if world_size <= 1:
        return
    environment = environment_recipe(recipe)
    for role in recipe.rl.roles:
        trained = set(trained_trace_roles(recipe, role))
        engines = sorted(r for r in adapter_of_role(recipe) if r not in trained
                         and route_for(environment.roles, r).backend == "vllm")
        if engines and recipe.rl.environment == "distilled":
            raise ConfigError(f"rl.environment: 'distilled' starts an in-process vLLM engine on each of the "
                              f"{world_size} ranks, all on GPU 0; with several ranks use rl.environment: server "
                              "(after `maps-train serve`) or recipe")
        if engines:
            raise ConfigError(f"roles: {', '.join(engines)} route to an in-process vLLM engine, which each of the "
                              f"{world_size} ranks would start on GPU 0; with several ranks use rl.environment: "
                              "server (after `maps-train serve`) or hf/openai routes")


def check_vllm_rollout(grpo: GRPOOptions) -> None:
    """What TRL's vLLM settings must be for MAPS episodes, which call the policy many times per step, each rank on
    its own schedule (not in lockstep with the other ranks)."""
    if grpo.vllm_enable_sleep_mode:
        raise ConfigError("rl.grpo.vllm_enable_sleep_mode: not with rl.rollout: vllm (the MAPS episodes call the "
                          "policy many times per step; TRL would put the engine to sleep after each call)")
    if grpo.vllm_tensor_parallel_size != 1:
        raise ConfigError("rl.grpo.vllm_tensor_parallel_size: must be 1 with rl.rollout: vllm (a tensor-parallel "
                          "group generates in lockstep; each rank's MAPS episodes call the policy on their own)")
    if grpo.vllm_mode not in ("colocate", "server"):
        raise ConfigError(f"rl.grpo.vllm_mode: 'colocate' or 'server', got '{grpo.vllm_mode}'")


def check_deployed_on_vllm(recipe: Recipe) -> None:
    """`rl.decoding: deployed` on TRL's vLLM: the schema must reach the engine, and vLLM masks the logits to the
    grammar before it computes any log-probability, so TRL's importance-sampling correction would weigh each
    token by the probability mass the grammar removed (about exp(-4.8) on the tiny test policy), not by how far the
    engine's weights lag the trainer's (`maps_train.rl.vllm_policy`)."""
    if recipe.rl.decoding != "deployed":
        return
    grpo = GRPOOptions.of(recipe.rl.grpo)
    if grpo.vllm_mode == "server":
        raise ConfigError(SERVER_TAKES_NO_SCHEMA)
    if grpo.vllm_importance_sampling_correction:
        raise ConfigError("rl.grpo.vllm_importance_sampling_correction: set it false with rl.decoding: deployed on "
                          "vLLM (its log-probabilities are masked to the role's schema, so TRL's correction would "
                          "weigh tokens by the mass the grammar removed), or use rl.rollout: hf or rl.decoding: free")
