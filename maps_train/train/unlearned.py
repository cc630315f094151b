"""An adapter with no SFT rows: every role it serves kept fewer rows than `sft_data.min_rows_per_role`, or none
passed its filter. `sft-data` says such roles are served by the base model; training keeps that promise.

Training such an adapter would teach nothing (TRL refuses an empty set), so `train` writes no weights for it:
its folder gets the marker and a training summary saying it learned nothing (`"learned": false`, every role at 0
rows). The summary marks it finished, as for any adapter, so a rerun skips it and `--overwrite` may remove it.
From there one reader, the adapter set (`maps_train.adapters`: the manifest `train` writes, or these records in a
folder without one), says that the adapter holds no weights, and everything asks it:
- the student's routes send its roles to the base model (`AdapterSet.routes`);
- a vLLM server loads no LoRA for it (`serve.plan.check_adapters`: `AdapterSet.served`), and an eval links no
  artifact for it;
- RL from it (`rl.init: distilled`) starts a fresh LoRA on the base model, as `rl.init: base` does
  (`rl.layout.policy_start`);
- `maps-train adapters check` says it learned nothing instead of "ok".
"""

from __future__ import annotations

from maps_train.adapters.set import LEARNED
from maps_train.train import data


def unlearned_summary(recipe, adapter: str) -> dict:
    """The training summary of an adapter with no rows: what it would have learned (nothing) and why."""
    sources = data.source_adapters(recipe, adapter)
    return {
        "recipe": recipe.name,
        "adapter": adapter,
        LEARNED: False,
        "reason": "no SFT rows (every role under sft_data.min_rows_per_role, or none passed the filter): "
                  "its roles are served by the base model",
        "sft_sources": sources,
        "trace_roles": sorted({role for name in sources for role in recipe.sft_data.adapter_roles[name]}),
        "student": recipe.train.student,
        "train_rows": 0,
        "rows_per_role": data.rows_per_role(recipe, adapter),
    }
