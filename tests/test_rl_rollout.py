"""Branch rollouts (maps_train/rl/rollout.py) on the real tiny Qwen3 policy with a LoRA adapter: what GRPO trains
on is exactly what the policy generated for the branch call, and nothing the environment wrote.

The environment's proposer and writer are the scripted double (their outputs are known strings, so a test can look
for them); the policy (the consolidator adapter: consolidator and answer calls) is the real model."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from scripted_backend import DEFAULT_PASSAGES, RecordingRetriever, ScriptedBackend

from maps_train.errors import MapsTrainError
from maps_train.llm.common import call_spec, render_prompt
from maps_train.llm.types import ChatRequest, Completion
from maps_train.questions import Question
from maps_train.recipe import load_recipe, route_for
from maps_train.rl.policy import ModelSampler, PolicyBackend, Sampling
from maps_train.rl.rollout import BranchRollouts, LoggedCall, ReplayBackend, policy_router, trained_trace_roles

G = 2
QUESTIONS = [Question(id=f"q{i}", question=f"Where was the founder of company {i} born?",
                      golden_answers=[f"city {i}"]) for i in range(2)]


@pytest.fixture(scope="module")
def policy_model(tiny_qwen3, make_lora_adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = make_lora_adapters(tiny_qwen3, ["consolidator"])["consolidator"]
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
    model.train()  # as the trainer holds it: the policy must sample in eval mode and hand it back in train mode
    return model, AutoTokenizer.from_pretrained(tiny_qwen3)


def make_rollouts(policy_model, seed: int = 0):
    model, tokenizer = policy_model
    recipe = load_recipe(None, ["agent.max_rounds=1", "agent.num_directions=2", "agent.top_k=2",
                                "roles.default.max_tokens=64"])
    roles = trained_trace_roles(recipe, "consolidator")
    sampling = Sampling(temperature=1.0, max_tokens=6)
    policy = PolicyBackend(ModelSampler(lambda: model, tokenizer, sampling), tokenizer, sampling, max_model_len=2048)
    environment = ScriptedBackend()
    router = policy_router(recipe, roles, policy, backends={"vllm": environment})
    rollouts = BranchRollouts(recipe, router, policy, RecordingRetriever(), roles, G, seed=seed)
    return recipe, rollouts, environment


def test_the_trained_tokens_are_the_policys_branch_call_and_nothing_the_environment_wrote(policy_model):
    model, tokenizer = policy_model
    recipe, branch_rollouts, environment = make_rollouts(policy_model)
    rollouts = branch_rollouts.run(QUESTIONS, step=0)
    assert model.training  # handed back as the trainer holds it

    assert [(r.source_id, r.branch) for r in rollouts] == [(q.id, g) for q in QUESTIONS for g in range(G)]
    env_texts = [call.raw_text for r in rollouts for call in r.trace.all_calls() if call.role in ("proposer", "writer")]
    assert len(environment.requests()) > 0 and env_texts
    passage_texts = [p.text for p in DEFAULT_PASSAGES]
    for rollout in rollouts:
        calls = rollout.trace.all_calls()
        trained = [i for i, call in enumerate(calls) if call.role in ("consolidator", "answer")]
        assert len(trained) == 2  # the consolidator's one round, the answer
        call = calls[trained[rollout.branch_call]]
        sample = rollout.sample
        # The prompt: the chat-templated messages of the branch call as the trace holds them, tokenised.
        route = policy_router(recipe, ["consolidator", "answer"], branch_rollouts.policy).route(call.role)
        request = ChatRequest(role=call.role, messages=call.messages)
        assert sample.prompt_text == render_prompt(tokenizer, call_spec(request, route))
        assert sample.prompt_ids == tokenizer(sample.prompt_text, add_special_tokens=False)["input_ids"]
        # The completion: what the model itself samples from that prompt with the call's seed, token for token.
        with torch.random.fork_rng():
            torch.manual_seed(call.usage.seed)
            model.eval()
            with torch.no_grad():
                again = model.generate(input_ids=torch.tensor([sample.prompt_ids]), do_sample=True, temperature=1.0,
                                       top_p=1.0, top_k=0, max_new_tokens=6)
            model.train()
        regenerated = again[0, len(sample.prompt_ids):].tolist()
        assert sample.completion_ids == regenerated[: len(sample.completion_ids)]
        assert tokenizer.decode(sample.completion_ids, skip_special_tokens=True) == call.generated
        # The log-probabilities: the model's own, at the sampling temperature, of exactly those tokens.
        with torch.no_grad():
            model.eval()
            logits = model(torch.tensor([sample.prompt_ids + sample.completion_ids])).logits[0]
            model.train()
        expected = torch.log_softmax(logits[len(sample.prompt_ids) - 1 : -1], -1)
        expected = expected.gather(1, torch.tensor(sample.completion_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
        # Nothing the environment wrote is a completion token; it is in the prompt.
        completion_text = tokenizer.decode(sample.completion_ids)
        assert not any(text in completion_text for text in env_texts + passage_texts)
        if call.role == "consolidator":
            assert any(text in sample.prompt_text for text in passage_texts)

    for q in QUESTIONS:
        group = [r for r in rollouts if r.source_id == q.id]
        # One branch call per group, one prompt: every call before it replayed from the pilot, identically.
        assert len({r.branch_call for r in group}) == 1 and len({tuple(r.sample.prompt_ids) for r in group}) == 1
        b = group[0].trace.all_calls()
        prefix = [i for i, call in enumerate(b) if call.role in ("consolidator", "answer")][group[0].branch_call]
        for r in group[1:]:
            assert [c.raw_text for c in r.trace.all_calls()[:prefix]] == [c.raw_text for c in b[:prefix]]
        # ...and afresh from there: each branch its own seed, so the sampled completions differ.
        seeds = [r.trace.all_calls()[prefix].usage.seed for r in group]
        assert len(set(seeds)) == G
        assert len({tuple(r.sample.completion_ids) for r in group}) > 1


def test_a_step_reruns_identically_and_another_step_draws_afresh(policy_model):
    first = make_rollouts(policy_model)[1].run(QUESTIONS[:1], step=4)
    again = make_rollouts(policy_model)[1].run(QUESTIONS[:1], step=4)
    assert [r.sample.completion_ids for r in first] == [r.sample.completion_ids for r in again]  # a resume samples
    assert [[c.raw_text for c in r.trace.all_calls()] for r in first] == [  # the same episodes
        [c.raw_text for c in r.trace.all_calls()] for r in again]
    later = make_rollouts(policy_model)[1].run(QUESTIONS[:1], step=5)
    assert [r.sample.completion_ids for r in later] != [r.sample.completion_ids for r in first]


def test_a_replayed_request_that_is_not_the_pilots_is_a_one_line_error():
    recorded = ChatRequest(role="proposer", messages=[{"role": "user", "content": "state A"}], question_id="q0~g0")
    replay = ReplayBackend(ScriptedBackend(), {"q0~g0": [LoggedCall(recorded, Completion(text="{}"))]})
    assert replay.generate([recorded])[0].text == "{}"
    live = replay.generate([dataclasses.replace(recorded, messages=[{"role": "user", "content": "anything"}])])
    assert json.loads(live[0].text)  # past the prefix: the live backend answers
    other = ReplayBackend(ScriptedBackend(), {"q0~g0": [LoggedCall(recorded, Completion(text="{}"))]})
    with pytest.raises(MapsTrainError, match=r"episode 'q0~g0' call 0 \(proposer\) is not the pilot's") as err:
        other.generate([dataclasses.replace(recorded, messages=[{"role": "user", "content": "state B"}])])
    assert "\n" not in str(err.value)


def test_a_role_outside_the_adapters_is_refused_in_one_line():
    recipe = load_recipe(None, [])
    assert trained_trace_roles(recipe, "consolidator") == ["answer", "consolidator"]
    assert trained_trace_roles(recipe, "writer") == ["writer"]
    with pytest.raises(MapsTrainError, match="rl.roles: 'critic' is no role"):
        trained_trace_roles(recipe, "critic")
    assert route_for(recipe.roles, "writer").backend == "vllm"


def test_the_passages_a_rollout_retrieved_let_golds_known_by_text_be_found():
    from maps_train.records.evidence import GoldPassage, evidence_recall
    from maps_train.rl.rollout import HitLog

    log = HitLog(RecordingRetriever())
    hits = log.search(["capital of France", "Dijon engineer"], 2)
    assert log.passages == {hit.id: hit for found in hits for hit in found}
    gold = [GoldPassage(None, "Paris", "Paris is the capital and largest city of France.")]  # no corpus id
    assert evidence_recall(gold, [hit.id for hit in hits[0]], log.passages) == 1.0
    assert evidence_recall(gold, [hit.id for hit in hits[0]], {}) == 0.0  # what the reward saw without them
