"""Serving the distilled agent: one student base in vLLM, one LoRA adapter per role, mixed in the same batches.

`plan_server(recipe)` checks the adapters and turns the recipe into the exact `vllm serve` command and the
routing table the agent uses against it; `distilled_routes(recipe, via=...)` gives the same routing for the
offline engine (one `LoRARequest` per role) or the server, so eval suites can run the distilled agent either way.
"""

from maps_train.serve.plan import ServerPlan, adapter_paths, distilled_routes, plan_server, with_distilled_routes

__all__ = ["ServerPlan", "adapter_paths", "distilled_routes", "plan_server", "with_distilled_routes"]
