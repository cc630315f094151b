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
from maps_train.llm.call_spec import call_spec
from maps_train.llm.rendering import render_prompt
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


def make_rollouts(policy_model, seed: int = 0, decoding: str = "free", max_rounds: int = 1, max_tokens: int = 6,
                  overrides: tuple[str, ...] = ()):
    model, tokenizer = policy_model
    recipe = load_recipe(None, [f"agent.max_rounds={max_rounds}", "agent.num_directions=2", "agent.top_k=2",
                                "roles.default.max_tokens=64", f"rl.decoding={decoding}", *overrides])
    roles = trained_trace_roles(recipe, "consolidator")
    sampling = Sampling(temperature=1.0, max_tokens=max_tokens)
    policy = PolicyBackend(ModelSampler(lambda: model, tokenizer), tokenizer, sampling, max_model_len=2048,
                           decoding=decoding)
    environment = ScriptedBackend()
    router = policy_router(recipe, roles, policy, backends={"vllm": environment})
    rollouts = BranchRollouts(recipe, router, policy, RecordingRetriever(), roles, G, seed=seed)
    return recipe, rollouts, environment


def resample(model, prompt_ids: list[int], seed: int, max_new_tokens: int, processor=None) -> list[int]:
    """What the model samples from `prompt_ids` at temperature 1 under `seed` (and a logits processor), in eval
    mode, handed back in train mode as the trainer holds it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt_ids]), do_sample=True, temperature=1.0, top_p=1.0,
                                 top_k=0, max_new_tokens=max_new_tokens,
                                 logits_processor=[processor] if processor is not None else None)
        model.train()
    return out[0, len(prompt_ids):].tolist()


def own_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> torch.Tensor:
    """The model's own log-probabilities of `completion_ids` after `prompt_ids` at temperature 1 (eval mode)."""
    with torch.no_grad():
        model.eval()
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0]
        model.train()
    expected = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], -1)
    return expected.gather(1, torch.tensor(completion_ids)[:, None])[:, 0]


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
        regenerated = resample(model, sample.prompt_ids, call.usage.seed, 6)
        assert sample.completion_ids == regenerated[: len(sample.completion_ids)]
        assert tokenizer.decode(sample.completion_ids, skip_special_tokens=True) == call.generated
        # The log-probabilities: the model's own, at the sampling temperature, of exactly those tokens.
        expected = own_logprobs(model, sample.prompt_ids, sample.completion_ids)
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


def test_a_role_the_distilled_adapter_never_learned_is_left_to_the_environment(tmp_path):
    (tmp_path / "consolidator").mkdir()
    (tmp_path / "consolidator" / "train_summary.json").write_text(
        json.dumps({"rows_per_role": {"consolidator": 17, "answer": 0}}))
    recipe = load_recipe(None, [f"rl.adapters_dir={tmp_path}"])
    assert trained_trace_roles(recipe, "consolidator") == ["consolidator"]
    assert trained_trace_roles(load_recipe(None, [f"rl.adapters_dir={tmp_path}", "rl.init=base"]),
                               "consolidator") == ["answer", "consolidator"]


def test_the_passages_a_rollout_retrieved_let_golds_known_by_text_be_found():
    from maps_train.records.evidence import GoldPassage, evidence_recall
    from maps_train.rl.rollout import HitLog

    log = HitLog(RecordingRetriever())
    hits = log.search(["capital of France", "Dijon engineer"], 2)
    assert log.passages == {hit.id: hit for found in hits for hit in found}
    gold = [GoldPassage(None, "Paris", "Paris is the capital and largest city of France.")]  # no corpus id
    assert evidence_recall(gold, [hit.id for hit in hits[0]], log.passages) == 1.0
    assert evidence_recall(gold, [hit.id for hit in hits[0]], {}) == 0.0  # what the reward saw without them


def test_only_calls_that_can_change_the_outcome_are_branch_points():
    from maps_train.rl.rollout import decisive_calls

    roles = ["proposer", "writer", "writer", "consolidator", "proposer", "writer", "consolidator", "answer"]
    calls = [LoggedCall(ChatRequest(role=role, messages=[]), Completion(text="")) for role in roles]
    # At the last round the search stops whatever the consolidator says: its call is no branch point.
    assert decisive_calls(calls, {"consolidator", "answer"}, max_rounds=2) == [3, 7]
    assert decisive_calls(calls, {"consolidator", "answer"}, max_rounds=3) == [3, 6, 7]
    assert decisive_calls(calls, {"consolidator", "answer"}, max_rounds=1) == [7]
    assert decisive_calls(calls, {"writer"}, max_rounds=2) == [1, 2, 5]  # every sub-query decides what is found
    # Before agent.min_rounds the search goes on whatever the consolidator says: no branch point either.
    assert decisive_calls(calls, {"consolidator", "answer"}, max_rounds=3, min_rounds=2) == [6, 7]


def test_deployed_decoding_samples_the_branch_call_under_its_schema_and_decodes_the_rest_as_deployed(policy_model):
    from maps_train.agents.outputs import answer_schema, consolidation_schema
    from maps_train.rl.grammar import JsonGrammars
    from maps_train.rl.rollout import PILOT, branch_id

    model, tokenizer = policy_model
    max_rounds = 2
    recipe, branch_rollouts, _ = make_rollouts(policy_model, decoding="deployed", max_rounds=max_rounds,
                                               max_tokens=24)
    rollouts = branch_rollouts.run(QUESTIONS, step=0)
    assert model.training
    policy = branch_rollouts.policy
    grammars = JsonGrammars(tokenizer, model.config.vocab_size)
    schemas = {"consolidator": consolidation_schema(), "answer": answer_schema()}
    route = route_for(recipe.roles, "consolidator")
    assert route.structured and route.temperature == 0  # the deployed route: schema, greedy

    pilots = [s for q in QUESTIONS for s in policy.samples_of(branch_id(q.id, PILOT))]
    assert pilots and not any(s.sampled for s in pilots) and all(s.constrained for s in pilots)
    continued = 0
    for rollout in rollouts:
        branch, *later = policy.samples_of(rollout.question.id)
        assert branch is rollout.sample and branch.sampled and branch.constrained
        calls = [c for c in rollout.trace.all_calls() if c.role in ("consolidator", "answer")]
        assert len(later) == len(calls) - rollout.branch_call - 1  # every later call of the trained roles...
        assert not any(s.sampled for s in later) and all(s.constrained for s in later)  # ...decoded as deployed
        continued += len(later)
        call = calls[rollout.branch_call]
        if rollout.trace.num_rounds == max_rounds:  # never the last round's consolidator
            assert call is not [c for c in rollout.trace.rounds[-1].calls if c.role == "consolidator"][0]
        assert call.usage.constrained and call.usage.temperature == 1.0
        assert all(c.usage.constrained and c.usage.temperature == 0 for c in calls[rollout.branch_call + 1:])
        # Every sampled token is one the role's grammar allows, compiled as the deployed vLLM route compiles it...
        matcher = grammars.matcher(schemas[call.role])
        assert all(matcher.accept_token(token) for token in branch.completion_ids)
        # ...and they are what the model samples under xgrammar's own logits processor with the call's seed.
        again = resample(model, branch.prompt_ids, call.usage.seed, 24, grammars.processor(schemas[call.role]))
        assert branch.completion_ids == again[: len(branch.completion_ids)]
        # The log-probabilities are the model's unmasked ones at the temperature: what TRL scores.
        expected = own_logprobs(model, branch.prompt_ids, branch.completion_ids)
        assert torch.allclose(torch.tensor(branch.logprobs), expected, atol=1e-4)
    assert continued > 0  # some branch point came before the answer
    for q in QUESTIONS:  # one prompt per group, G samples of it
        group = [r for r in rollouts if r.source_id == q.id]
        assert len({tuple(r.sample.prompt_ids) for r in group}) == 1
        assert len({tuple(r.sample.completion_ids) for r in group}) > 1


def test_both_decisions_fix_stop_in_even_branches_and_go_on_in_odd_ones(policy_model):
    from maps_train.agents.outputs import consolidation_schema
    from maps_train.rl.grammar import JsonGrammars
    from maps_train.rl.policy import fixed_decision

    model, tokenizer = policy_model
    grammars = JsonGrammars(tokenizer, model.config.vocab_size)
    # The grammar, compiled as deployed, accepts only the fixed decision.
    for value, other in ((True, "false"), (False, "true")):
        fixed = fixed_decision(consolidation_schema(), "sufficient", value)
        assert grammars.matcher(fixed).accept_string(f'{{"observation":"o","state":"s","sufficient":{str(value).lower()}}}')
        assert not grammars.matcher(fixed).accept_string(f'{{"observation":"o","state":"s","sufficient":{other}}}')
    _, branch_rollouts, _ = make_rollouts(policy_model, decoding="deployed", max_rounds=2, max_tokens=24,
                                          overrides=("rl.decisions=both",))
    policy = branch_rollouts.policy
    sent = []
    spec_of = policy._spec
    policy._spec = lambda request, route: sent.append(spec_of(request, route)) or sent[-1]
    parities = set()
    for step in range(8):  # the branch point is drawn per step: until groups branched at a consolidator
        sent.clear()
        for rollout in branch_rollouts.run(QUESTIONS, step=step):
            call = [c for c in rollout.trace.all_calls() if c.role in ("consolidator", "answer")][rollout.branch_call]
            if call.role != "consolidator":
                continue
            stop = rollout.branch % 2 == 0
            # The branch call went out sampled under the grammar with the decision fixed, and every token it
            # sampled is one that grammar accepts; no other call of the episode had its decision fixed.
            [spec] = [s for s in sent if s.request.question_id == rollout.question.id and s.temperature == 1.0]
            assert spec.json_schema == fixed_decision(consolidation_schema(), "sufficient", stop)
            matcher = grammars.matcher(spec.json_schema)
            assert all(matcher.accept_token(token) for token in rollout.sample.completion_ids)
            later = [s for s in sent if s.request.question_id == rollout.question.id and s.temperature == 0]
            assert all(s.json_schema in (consolidation_schema(), None) or "answer" in s.json_schema["properties"]
                       for s in later)
            parities.add(stop)
        if parities == {True, False}:
            break
    assert parities == {True, False}
    assert policy.fixed_decisions == {}  # each used once, on its branch call


@pytest.mark.parametrize("override, message", [
    ("rl.decoding=free", "needs rl.decoding: deployed and an even rl.num_generations (got free, 4)"),
    ("rl.num_generations=3", "needs rl.decoding: deployed and an even rl.num_generations (got deployed, 3)"),
])
def test_both_decisions_need_the_grammar_and_even_groups(override, message, tmp_path):
    from maps_train.errors import ConfigError
    from maps_train.rl.checks import check_rl_config

    recipe = load_recipe(None, ["rl.decisions=both", override, "rl.grpo.per_device_train_batch_size=12",
                                f"rl.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=f"^rl.decisions: .*{message.replace('(', '[(]').replace(')', '[)]')}"):
        check_rl_config(recipe)


def test_free_decoding_samples_every_policy_call_without_a_schema(policy_model):
    _, branch_rollouts, _ = make_rollouts(policy_model, decoding="free", max_rounds=2)
    branch_rollouts.run(QUESTIONS[:1], step=0)
    samples = branch_rollouts.policy.samples
    assert samples and all(s.sampled and not s.constrained for s in samples)
