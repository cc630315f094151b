"""The world an RL'd role acts in: who answers the calls RL does not train (`rl.environment`, from an adapter set:
once a role's RL adapter is trained, the next role's environment is the set with that adapter replaced), and the
training questions."""

from __future__ import annotations

import dataclasses

from maps_train.adapters import AdapterSet, rl_source_set, with_student_routes
from maps_train.errors import ConfigError
from maps_train.questions import Question
from maps_train.recipe import Recipe, route_for


def environment_recipe(recipe: Recipe, adapters: AdapterSet | None = None) -> Recipe:
    """The recipe whose routes answer the calls RL does not train (`rl.environment`): the student with `adapters`
    (default: RL's starting set, `adapters.rl_source_set`, the very set the policy starts from; an in-process vLLM
    engine, or the served adapters by name), or the recipe's own roles, where an hf or vllm route of a role an RL'd
    adapter of `adapters` learned names that adapter's folder (an openai route names a served adapter, which only a
    server restart with the new folder changes)."""
    adapters = adapters if adapters is not None else rl_source_set(recipe)
    if recipe.rl.environment == "recipe":
        roles = dict(recipe.roles)
        for adapter in adapters.adapters.values():
            if adapter.stage != "rl" or adapter.folder is None:
                continue
            for role in adapter.learned or adapter.roles:
                route = route_for(recipe.roles, role)
                if route.backend in ("hf", "vllm") and route.adapter:
                    roles[role] = dataclasses.replace(route, adapter=str(adapter.folder))
        return dataclasses.replace(recipe, roles=roles)
    via = "engine" if recipe.rl.environment == "distilled" else "server"
    return with_student_routes(recipe, adapters, via=via)


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
