"""A reward that can teach: hedges score 0, cost charged only to right branches, the branch call's own credit as the
process reward, each part computed once a batch; and advantages as TRL's own GRPOTrainer computes them with
maps-train's GRPO defaults (scale_rewards none): a group that differs only by a few tokens of cost gets
advantages of a few thousandths, and a group with one right branch gives it the largest advantage."""

from __future__ import annotations

import dataclasses

import pytest

from maps_train.errors import ConfigError, MapsTrainError
from maps_train.questions import Question
from maps_train.recipe import RLRewardConfig, load_recipe
from maps_train.records.answer import Cost, RoleCost
from maps_train.records.credit import compute_credit
from maps_train.records.evidence import gold_evidence
from maps_train.records.trace import CallUsage, RoleCall, RoundRecord, SubQueryHits, TraceRecord
from maps_train.rl.checks import check_rl_config
from maps_train.rl.rewards import correctness, hedges, reward_functions, reward_parts, strict_cover_em

GOLD = {"supporting_paragraphs": [{"title": "Dijon", "text": "Dijon is in Burgundy.", "corpus_id": "p5"}]}


def question(golds: list[str], qid: str = "q1") -> Question:
    return Question(id=qid, question="Where?", golden_answers=golds, metadata=GOLD)


def call(role: str, ok: bool = True) -> RoleCall:
    return RoleCall(role=role, messages=[{"role": "user", "content": role}], raw_text="{}", parsed={}, parse_ok=ok,
                    usage=CallUsage())


def episode(answer: str, tokens: int = 3000, hits: list[str] | None = None, stop: bool = True,
            writer_ok: bool = True, qid: str = "q1") -> TraceRecord:
    round_ = RoundRecord(index=1, calls=[call("proposer"), call("writer", writer_ok), call("consolidator")],
                         sub_queries=["q"], retrieved=[SubQueryHits("q", hits or ["p1"])], sufficient=stop)
    cost = Cost(by_role={"answer": RoleCost(calls=1, prompt_tokens=tokens - 10, completion_tokens=10)}, retrievals=1)
    trace = TraceRecord(question_id=qid, question="Where?", dataset="toy", method="maps", config_digest="d",
                        rounds=[round_], stop_reason="sufficient", final_call=call("answer"), final_answer=answer,
                        golden_answers=["Dijon"], cost=cost)
    trace.credit = compute_credit(trace, gold_evidence(GOLD))
    return trace


COVER = RLRewardConfig(correctness="cover_em")


@pytest.mark.parametrize("answer,golds", [
    ("yes or no", ["yes"]), ("yes or no", ["no"]), ("unknown", ["no"]), ("not known", ["no"]),
    ("Paris or Lyon", ["Paris"]), ("Paris or Lyon", ["Lyon"]), ("1 2 3 4 5 6 7 8 9", ["7"]),
    ("either Paris", ["Paris"]), ("yes, no", ["no"]),
])
def test_hedges_score_zero(answer, golds):
    assert correctness(episode(answer), question(golds), COVER) == 0.0


def test_cover_em_keeps_what_a_real_answer_says():
    assert correctness(episode("It is Dijon."), question(["Dijon"]), COVER) == 1.0
    assert correctness(episode("3 March 1990"), question(["1990"]), COVER) == 1.0  # a date is one candidate
    assert strict_cover_em("the art of war", ["art"]) == 1.0 and strict_cover_em("start", ["art"]) == 0.0
    assert not hedges("Dijon, France") and hedges("Dijon or Lyon")


def test_only_a_right_branch_pays_its_cost():
    config = RLRewardConfig(cost_weight=0.1, cost_unit="tokens", cost_scale=1000)
    trained = ["consolidator", "answer"]
    assert reward_parts(episode("Dijon", 3000), question(["Dijon"]), trained, config)["cost"] == -3.0
    assert reward_parts(episode("Lyon", 3000), question(["Dijon"]), trained, config)["cost"] == 0.0
    charged = dataclasses.replace(config, charge_cost="all")
    assert reward_parts(episode("Lyon", 3000), question(["Dijon"]), trained, charged)["cost"] == -3.0


def test_process_and_format_score_the_branch_call_itself():
    config = RLRewardConfig()
    found, missed = episode("x", hits=["p5"]), episode("x", hits=["p1"], writer_ok=False)
    writer = ["writer"]  # the writer's one call is its branch call 0
    assert reward_parts(found, question(["Dijon"]), writer, config, branch_call=0)["process"] == 1.0
    assert reward_parts(missed, question(["Dijon"]), writer, config, branch_call=0)["process"] == 0.0
    assert reward_parts(missed, question(["Dijon"]), writer, config, branch_call=0)["format"] == 0.0
    # The consolidator adapter's calls: consolidator (b = 0), answer (b = 1). Stopping with the gold found is right;
    # stopping without it is wrong; the answer call is credited by its F1.
    both = ["consolidator", "answer"]
    assert reward_parts(found, question(["Dijon"]), both, config, branch_call=0)["process"] == 1.0
    assert reward_parts(missed, question(["Dijon"]), both, config, branch_call=0)["process"] == 0.0
    assert reward_parts(episode("Dijon France"), question(["Dijon"]), both, config,
                        branch_call=1)["process"] == pytest.approx(2 / 3)


def test_each_part_is_computed_once_a_batch():
    functions = reward_functions(RLRewardConfig(), ["consolidator", "answer"])
    traces, questions = [episode("Dijon").to_dict()] * 2, [question(["Dijon"]).to_dict()] * 2
    for function in functions:
        function(completions=["c", "c"], trace=traces, question=questions)
    assert functions[0].shared.computed == 1
    functions[0](completions=["c", "c"], trace=list(traces), question=questions)  # a new batch: a new list
    assert functions[0].shared.computed == 2


# --- advantages in TRL's own GRPOTrainer ----------------------------------------------------------------------


def trl_advantages(tiny_qwen3: str, tmp_path, traces: list[TraceRecord], config_overrides: list[str]) -> list[float]:
    """The advantages TRL's GRPOTrainer computes for one group of len(traces) rollouts, with the GRPOConfig
    `maps-train rl` builds (rl.grpo defaults) and maps-train's reward functions."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import build_grpo_config

    g = len(traces)
    recipe = load_recipe(None, [f"rl.num_generations={g}", f"rl.grpo.per_device_train_batch_size={g}",
                                f"rl.output_dir={tmp_path}", "rl.roles=[consolidator]", *config_overrides])
    args = build_grpo_config(RoleRun.of(recipe, "consolidator"), bf16=False, wandb_on=False)
    funcs = reward_functions(recipe.rl.reward_for("consolidator"), ["consolidator", "answer"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    tokenizer.padding_side = "left"

    def rollout(prompts, trainer):
        return {"prompt_ids": [[1, 2, 3]] * len(prompts), "completion_ids": [[4, 5, tokenizer.eos_token_id]] * len(prompts),
                "logprobs": [[-1.0, -1.0, -1.0]] * len(prompts), "trace": [t.to_dict() for t in traces],
                "question": [question(["Dijon"]).to_dict()] * len(prompts), "branch_call": [1] * len(prompts)}

    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_qwen3), reward_funcs=funcs, args=args,
                          train_dataset=Dataset.from_list([{"prompt": "q1"}]), processing_class=tokenizer,
                          rollout_func=rollout)
    batch = trainer._generate_and_score_completions([{"prompt": "q1"} for _ in range(g)])
    return batch["advantages"].flatten().tolist()


@pytest.mark.slow
def test_trl_advantages_ignore_a_few_tokens_and_favour_the_right_branch(tiny_qwen3, tmp_path):
    # Four wrong branches of 3012, 3009, 3010 and 3003 tokens at lambda 0.1 per 1000 tokens (issue 45's case: TRL's
    # default std scaling gave them -0.72, -0.10, -0.31, +1.13).
    lam = ["rl.reward.cost_weight=0.1", "rl.reward.cost_unit=tokens", "rl.reward.cost_scale=1000"]
    wrong = [episode("Lyon", tokens) for tokens in (3012, 3009, 3010, 3003)]
    advantages = trl_advantages(tiny_qwen3, tmp_path / "a", wrong, lam)
    assert max(abs(a) for a in advantages) < 0.05
    # What TRL's own default (std scaling per group) makes of the same cost differences: unit-size advantages.
    scaled = trl_advantages(tiny_qwen3, tmp_path / "s", wrong,
                            [*lam, "rl.reward.charge_cost=all", "rl.grpo.scale_rewards=group"])
    assert max(abs(a) for a in scaled) > 0.5
    # Charged to every branch, the cost still moves them by thousandths only: lambda keeps its meaning.
    charged = trl_advantages(tiny_qwen3, tmp_path / "b", wrong, [*lam, "rl.reward.charge_cost=all"])
    assert max(abs(a) for a in charged) < 0.05
    # One right branch, and the most expensive one: it gets the largest advantage, and by far.
    mixed = [episode("Dijon", 3012), *wrong[1:]]
    advantages = trl_advantages(tiny_qwen3, tmp_path / "c", mixed, lam)
    assert advantages[0] == max(advantages) and advantages[0] > 0.5
    assert all(a < 0 for a in advantages[1:])


# --- what a run records and refuses -----------------------------------------------------------------------------


def test_a_role_trained_under_other_reward_settings_is_refused_not_skipped(tmp_path):
    import json

    from maps_train.rl.layout import RoleRun

    run = RoleRun.of(load_recipe(None, [f"rl.output_dir={tmp_path}", "rl.reward.cost_weight=0.1"]), "consolidator")
    assert run.reward_settings()["reward"]["cost_weight"] == 0.1
    assert run.reward_settings()["scale_rewards"] == "none"
    run.record_reward_settings()  # a first run writes them
    run.record_reward_settings()  # a resume under the same ones goes on
    other = RoleRun.of(load_recipe(None, [f"rl.output_dir={tmp_path}", "rl.reward.cost_weight=0.2",
                                          "rl.grpo.scale_rewards=group"]), "consolidator")
    with pytest.raises(MapsTrainError, match=r"reward_settings.json: rl consolidator was trained under other reward "
                                             r"settings \(reward.cost_weight, scale_rewards differ\)"):
        other.record_reward_settings()
    assert (run.trainer_dir / "reward_settings.json").is_file()
    run.summary_file.parent.mkdir(parents=True, exist_ok=True)
    run.summary_file.write_text(json.dumps({"reward_settings": run.reward_settings()}))
    assert run.is_finished()
    with pytest.raises(MapsTrainError, match=r"rl_summary.json: rl consolidator was trained under other reward"):
        other.is_finished()
    run.summary_file.write_text(json.dumps({"global_step": 3}))  # a summary from before the settings were recorded
    with pytest.raises(MapsTrainError, match=r"\(\(none recorded\) differ\)"):
        run.is_finished()


def test_the_policy_scores_without_dropout(tiny_qwen3, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from maps_train.rl.policy_model import without_dropout

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_qwen3),
                           LoraConfig(r=4, lora_dropout=0.5, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False))  # a trained adapter: B is not 0
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    torch.manual_seed(0)
    model.train()
    noisy = model(ids).logits
    without_dropout(model).train()
    with torch.no_grad():
        trained = model(ids).logits
        model.eval()
        sampled = model(ids).logits
    assert torch.equal(trained, sampled)  # what TRL scores in train mode is what the policy sampled from
    assert not torch.equal(noisy.detach(), sampled)  # with dropout on it was not


def test_a_role_reward_prices_one_role_and_leaves_the_others(tmp_path):
    import json

    from maps_train.rl.layout import RoleRun
    from maps_train.rl.policy_model import build_grpo_config
    from maps_train.rl.rewards import reward_weights

    both = [f"rl.output_dir={tmp_path}", "rl.roles=[writer, consolidator]", "rl.reward.process_weight=1.0"]
    recipe = load_recipe(None, [*both, "rl.role_reward={consolidator: {cost_weight: 0.2, charge_cost: all}}"])
    check_rl_config(recipe)
    consolidator, writer = recipe.rl.reward_for("consolidator"), recipe.rl.reward_for("writer")
    assert (consolidator.cost_weight, consolidator.charge_cost, consolidator.process_weight) == (0.2, "all", 1.0)
    assert (writer.cost_weight, writer.charge_cost, writer.process_weight) == (0.0, "right", 1.0)
    # TRL's own GRPOConfig gets each role's weights (the cost part is the third).
    weights = {role: build_grpo_config(RoleRun.of(recipe, role), bf16=False, wandb_on=False).reward_weights
               for role in ("writer", "consolidator")}
    assert weights == {role: reward_weights(recipe.rl.reward_for(role)) for role in weights}
    assert weights["consolidator"][2] == 0.2 and weights["writer"][2] == 0.0
    # Each role records its own reward: the consolidator's summary holds 0.2, and changing only the writer's
    # reward leaves the finished consolidator skipped, not refused.
    run = RoleRun.of(recipe, "consolidator")
    run.record_reward_settings()
    run.summary_file.parent.mkdir(parents=True, exist_ok=True)
    run.summary_file.write_text(json.dumps({"global_step": 2, "reward_settings": run.reward_settings()}))
    writer_priced = load_recipe(None, [*both, "rl.role_reward={consolidator: {cost_weight: 0.2, charge_cost: all},"
                                              " writer: {cost_weight: 0.5}}"])
    assert RoleRun.of(writer_priced, "consolidator").is_finished()
    unpriced = load_recipe(None, both)
    with pytest.raises(MapsTrainError, match=r"reward.charge_cost, reward.cost_weight differ"):
        RoleRun.of(unpriced, "consolidator").is_finished()


@pytest.mark.parametrize("override, message", [
    ("{consolidator: {cost_wieght: 0.2}}",
     "rl.role_reward.consolidator.cost_wieght: unknown rl.reward field (did you mean 'cost_weight'?)"),
    ("{consolidator: {cost_weight: -1}}", "rl.role_reward.consolidator.cost_weight: must be a finite number >= 0"),
    ("{consolidator: {charge_cost: some}}", "rl.role_reward.consolidator.charge_cost: expected one of 'right', 'all'"),
    ("{consolidator: 0.2}", "rl.role_reward.consolidator: expected dict, got 0.2"),
])
def test_a_wrong_role_reward_is_one_line_naming_its_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_recipe(None, [f"rl.role_reward={override}"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_role_reward_names_a_role_or_is_refused(tmp_path):
    # A role this run does not train keeps its entry for the run that does: the study's recipe prices the
    # consolidator, and `rl.roles=[writer]` RLs the writer alone under its own (unpriced) reward.
    recipe = load_recipe(None, [f"rl.output_dir={tmp_path}", "rl.roles=[writer]",
                                "rl.role_reward={consolidator: {cost_weight: 0.2}}"])
    check_rl_config(recipe)
    assert recipe.rl.reward_for("writer") == recipe.rl.reward
    assert recipe.rl.reward_for("consolidator").cost_weight == 0.2
    typo = load_recipe(None, [f"rl.output_dir={tmp_path}", "rl.roles=[writer]",
                              "rl.role_reward={consolidater: {cost_weight: 0.2}}"])
    with pytest.raises(ConfigError, match=r"^rl.role_reward.consolidater: no role of sft_data.adapter_roles "
                                          r"\(did you mean 'consolidator'\?\)") as err:
        check_rl_config(typo)
    assert "\n" not in str(err.value)
