"""Serving the distilled agent: one student base in vLLM, one LoRA adapter per role, mixed in the same batches.

`plan_server(recipe, adapter_set)` checks an adapter set's adapters and turns the recipe into the exact `vllm serve`
command and the routing table the agent uses against it; the set's own routes (`maps_train.adapters`,
`AdapterSet.routes`) give the same routing for the offline engine (one `LoRARequest` per role) or the server, so
eval suites can run the distilled agent either way.
"""

from maps_train.serve.plan import ServerPlan, plan_server

__all__ = ["ServerPlan", "plan_server"]
