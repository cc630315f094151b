"""Agents: the MAPS engine and its ablations (and, in `baselines/`, the other methods), batched over questions.

`run_method(recipe, questions, out_dir)` is the entry point; engines register by method name
(`registry.register_method`) and share the machinery in `engine` (batched role calls, batched search, traces),
`outputs`/`jsonparse` (schemas, tolerant parsing), `prompting` (prompt files), and `evidence`.
"""

from maps_train.agents.registry import available_methods, engine_class, register_method
from maps_train.agents.runner import build_engine, run_method

__all__ = ["available_methods", "build_engine", "engine_class", "register_method", "run_method"]
