"""The world an RL'd role acts in: who answers the calls RL does not train (`rl.environment`), the routes once a
role's RL adapter is trained (the next role's environment), and the training questions."""

from __future__ import annotations

import dataclasses

from maps_train.errors import ConfigError
from maps_train.questions import Question
from maps_train.recipe import Recipe, route_for
from maps_train.rl.layout import rl_adapter_dir
from maps_train.rl.rollout import trained_trace_roles


def with_rl_adapter(recipe: Recipe, role: str) -> Recipe:
    """The recipe whose routes of the RL'd adapter's roles name the new adapter folder (hf and vllm routes; an
    openai route names a served adapter, which only a server restart with the new folder changes)."""
    folder = str(rl_adapter_dir(recipe, role))
    roles = dict(recipe.roles)
    for trace_role in trained_trace_roles(recipe, role):
        route = route_for(recipe.roles, trace_role)
        if route.backend in ("hf", "vllm") and route.adapter:
            roles[trace_role] = dataclasses.replace(route, adapter=folder)
    return dataclasses.replace(recipe, roles=roles)


def environment_recipe(recipe: Recipe) -> Recipe:
    """The recipe whose routes answer the calls RL does not train (`rl.environment`): the distilled student's
    (adapters from rl.adapters_dir, else serve.adapters_dir or train.output_dir; an in-process vLLM engine, or the
    served adapters by name), or the recipe's own roles."""
    if recipe.rl.environment == "recipe":
        return recipe
    from maps_train.serve.plan import with_distilled_routes

    serve = dataclasses.replace(recipe.serve, adapters_dir=recipe.rl.adapters_dir or recipe.serve.adapters_dir)
    via = "engine" if recipe.rl.environment == "distilled" else "server"
    return with_distilled_routes(dataclasses.replace(recipe, serve=serve), via=via)


def load_rl_questions(recipe: Recipe) -> list[Question]:
    from maps_train.questions import load_questions

    files = recipe.rl.questions or recipe.traces.questions
    if not files:
        raise ConfigError("rl.questions: no training questions (and traces.questions is empty)")
    questions: list[Question] = []
    for path in files:
        questions += load_questions(path, limit=recipe.rl.limit)
    if not questions:
        raise ConfigError(f"rl.limit: no training questions ({recipe.rl.limit} from {', '.join(map(str, files))}); "
                          "a run that trains no step would pass the distilled adapter off as trained")
    return questions
