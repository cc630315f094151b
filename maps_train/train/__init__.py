"""LoRA SFT of the student, one adapter per role (or one shared adapter), under `accelerate launch`.

- `data`: reads `<sft_dir>/<adapter>/{train,eval}.jsonl` (TRL conversational prompt-completion rows).
- `sft`: builds the `SFTConfig`/`LoraConfig` from a recipe, runs one adapter's training, saves it for vLLM.
- `callbacks`: training tokens per second in the logs (and so in W&B).
- `adapter_check`: checks that a saved adapter is one vLLM's multi-LoRA serving accepts.
- `launch`: the `accelerate launch` command lines behind `maps-train train`.
- `__main__`: the entry point, `accelerate launch ... -m maps_train.train --config RECIPE --role ROLE`.
"""
