"""`maps-train plan`: the memory arithmetic against hand-computed values, the refusal of issue 35's 1.7B recipe,
every shipped recipe and suite passing on the hardware it names, and a model read from its own config.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from maps_train.errors import MapsTrainError
from maps_train.llm.pool import ENGINE_CONTEXT_BYTES
from maps_train.plan import memory
from maps_train.plan.shapes import model_shape, shipped
from maps_train.plan.stages import make_plan

REPO = Path(__file__).resolve().parents[1]
SHIPPED_RECIPES = sorted(
    str(path.relative_to(REPO)) for folder in ("teacher", "distill", "paper", "demo")
    for path in (REPO / "recipes" / folder).glob("*.yaml")
)
SHIPPED_SUITES = sorted(str(path.relative_to(REPO)) for path in (REPO / "eval" / "suites").glob("*.yaml"))


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name their accelerate configs and data relative to the repository


def test_qwen3_0_6b_sizes_by_hand():
    shape = model_shape("Qwen/Qwen3-0.6B")
    # 28 layers x (q 1024x2048 + k, v 1024x1024 each + o 2048x1024 + q/k norms 2x128 + MLP 3x1024x3072 + 2 norms
    # of 1024) + the tied 151,936 x 1024 embedding + the final norm
    per_layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert shape.parameters() == 28 * per_layer + 151_936 * 1024 + 1024 == 596_049_920
    engine = memory.engine_memory(shape, tensor_parallel=1, max_model_len=4096, max_loras=0, max_lora_rank=16,
                                  budget=80 * memory.GB)
    assert engine.weights == 596_049_920 * 2  # bf16
    assert memory.kv_bytes_per_token(shape, 1) == 2 * 28 * 8 * 128 * 2
    assert shape.lora_parameters(64) == 64 * 28 * ((1024 + 2048) + 2 * (1024 + 1024) + (2048 + 1024)
                                                   + 2 * (1024 + 3072) + (3072 + 1024))


def test_activations_per_token_by_hand():
    """Issue 35: about 4 MB a token for Qwen3-1.7B and about 2.3 MB for 0.6B without checkpointing (LoRA r64,
    dropout 0.05); the formula's own count per layer, by hand: attention 2h+4q+4kv, MLP 2h+4i, LoRA 7r, in bf16,
    plus the dropped-out inputs (5h+q+i) in bf16 and their one-byte masks."""
    h, q, kv, i, r = 2048, 2048, 1024, 6144, 64
    layer = 2 * ((2 * h + 4 * q + 4 * kv) + (2 * h + 4 * i) + 7 * r + (5 * h + q + i)) + (5 * h + q + i)
    big = model_shape("Qwen/Qwen3-1.7B")
    assert memory.layer_activation_bytes(big, 64, 0.05) == layer and 28 * layer == 4_096_512
    # every layer's activations, and the gradients of the one being differentiated (one layer more)
    assert memory.activation_bytes_per_token(big, 64, 0.05, checkpointing=False) == 29 * layer
    small = memory.layer_activation_bytes(model_shape("Qwen/Qwen3-0.6B"), 64, 0.05) * 28
    assert 2.3e6 <= small <= 2.6e6
    # checkpointing keeps each layer's bf16 input, one layer recomputed and its gradients
    assert memory.activation_bytes_per_token(big, 64, 0.05, checkpointing=True) == 28 * 2 * h + 2 * layer


DECODERS = sorted(doc["model"] for doc in shipped().values() if doc["config"]["model_type"].startswith("qwen"))


@pytest.mark.parametrize("model", DECODERS)
def test_shipped_sizes_match_the_published_parameter_counts(model):
    """Counts computed from the shipped config values against the published ones, which are rounded: within 2%
    (dense), 5% for the mixture of experts' total and 20% for its "A3B" (3B active, rounded from 3.45B)."""
    shape, published = model_shape(model), shipped()[model.lower()]["published"]
    tolerance = 0.05 if shape.num_experts else 0.02
    assert shape.parameters() == pytest.approx(published["parameters"], rel=tolerance)
    if "non_embedding_parameters" in published:
        non_embedding = shape.parameters() - shape.embedding_parameters()
        assert non_embedding == pytest.approx(published["non_embedding_parameters"], rel=tolerance)
    if "active_parameters" in published:
        assert shape.parameters(active=True) == pytest.approx(published["active_parameters"], rel=0.2)


def test_refuses_qwen3_1_7b_at_batch_16_without_checkpointing_on_one_gpu():
    """The 1.7B recipe as it was (batch 16 x 4096, no checkpointing) on one 80 GB GPU: refused in a few one-line
    reasons, the training one saying by how much and what to change; the change it names then fits."""
    as_it_was = ["train.sft.per_device_train_batch_size=16", "train.sft.gradient_accumulation_steps=2",
                 "train.sft.gradient_checkpointing=false"]
    result = CliRunner().invoke(_app(), ["plan", "recipes/distill/qwen3-1.7b.yaml", *as_it_was,
                                         "--gpus", "1", "--gpu-memory-gb", "80"])
    assert result.exit_code == 2
    refusals = [line for line in result.stderr.splitlines() if line.startswith("maps-train: plan refused:")]
    assert 1 <= len(refusals) <= 6 and len(result.stderr.splitlines()) == len(refusals)
    train = next(line for line in refusals if "train proposer" in line)
    assert "Qwen/Qwen3-1.7B at batch 16 x 4096 tokens needs 286.2 GB a GPU, 206.2 GB over 80.0 GB" in train
    assert train.endswith("set train.sft.gradient_checkpointing=true")
    fixed = make_plan("recipes/distill/qwen3-1.7b.yaml", [*as_it_was, "train.sft.gradient_checkpointing=true"],
                      gpus=1, gpu_memory_gb=80)
    assert not [p for p in fixed.problems if "Qwen/Qwen3-1.7B at batch" in p]


def test_the_refusal_lowers_the_batch_when_checkpointing_is_not_enough():
    plan = make_plan("recipes/distill/qwen3-1.7b.yaml", ["train.sft.per_device_train_batch_size=32"],
                     gpus=8, gpu_memory_gb=40)
    (train,) = [p for p in plan.problems if p.startswith("train")]
    advice = train.split("; set ")[1].removesuffix(" (the same effective batch)").split()
    assert "train.sft.gradient_accumulation_steps" in " ".join(advice)
    batch = int(advice[0].split("=")[1])
    assert batch < 32 and int(advice[1].split("=")[1]) * batch == 32 * 4  # the effective batch is kept
    assert not [p for p in make_plan("recipes/distill/qwen3-1.7b.yaml", advice, gpus=8, gpu_memory_gb=40).problems
                if p.startswith("train")]


def test_the_lm_head_is_counted_as_trls_fused_head_allocates_it():
    """TRL 1.16's SFTTrainer takes the loss through its fused LM head: on CUDA only the labelled positions are
    projected, through one reused 4096 x 32768 tile; no batch x length x vocab logits exist. Qwen3-0.6B (h 1024,
    151,936 vocabulary) at 8 x 4096 tokens in bf16, every position labelled (the worst batch): the tile, the scored
    hidden states with their fp32 and bf16 gradients, the gradient scattered back to all positions, 12 fp32 values
    a position: 0.6 GB, where full fp32 logits would be 19.9 GB."""
    shape = model_shape("Qwen/Qwen3-0.6B")
    tokens = 8 * 4096
    by_hand = 4096 * 32768 * 2 + tokens * 1024 * (2 + 4 + 2) + tokens * 1024 * 2 + tokens * 12 * 4
    assert memory.fused_head_bytes(shape, tokens=tokens, scored=tokens, compute_bytes=2) == by_hand
    assert by_hand == pytest.approx(0.61e9, abs=0.01e9) and by_hand < tokens * 151_936 * 4 / 30
    need = memory.train_memory(shape, batch=8, max_length=4096, lora_rank=64, lora_dropout=0.05,
                               checkpointing=True, bf16=True, world=8, zero_stage=0)
    assert need.lm_head == by_hand
    # fewer labelled positions (a role call's completion is 10-25% of its row): a smaller head, never a larger one
    assert memory.fused_head_bytes(shape, tokens=tokens, scored=tokens // 5, compute_bytes=2) < by_hand


def test_settings_that_fit_the_trainer_are_accepted_and_impossible_ones_still_refused():
    """Issue 47: with the fused head counted as TRL allocates it, Qwen3-0.6B at batch 32 x 4096 with checkpointing
    plans 36.3 GB on one 80 GB GPU (the full-logits count said 102.7 and refused), the shipped 4B and 8B recipes fit
    a 40 GB GPU, and the 1.7B at batch 16 x 4096 without checkpointing (286 GB) is still refused."""
    result = CliRunner().invoke(_app(), ["plan", "recipes/distill/qwen3-0.6b.yaml", "--gpus", "1",
                                         "--gpu-memory-gb", "80", "train.sft.per_device_train_batch_size=32"])
    assert result.exit_code == 0, result.stderr
    (train,) = [line for line in result.stdout.splitlines() if line.startswith("train ")]
    assert " 36.3 GB " in train
    # the teacher's index and traces (tensor parallel 4) are the base recipe's, planned with it
    assert "planned with the base: maps-train plan recipes/teacher/qwen3-32b.yaml" in result.stdout
    for recipe in ("recipes/distill/qwen3-4b.yaml", "recipes/distill/qwen3-8b.yaml"):
        assert not [p for p in make_plan(recipe, [], gpus=8, gpu_memory_gb=40).problems if p.startswith("train")]
    refused = make_plan("recipes/distill/qwen3-1.7b.yaml", ["train.sft.per_device_train_batch_size=16",
                                                            "train.sft.gradient_checkpointing=false"],
                        gpus=1, gpu_memory_gb=80)
    assert [p for p in refused.problems if p.startswith("train") and "needs 286.2 GB" in p]


@pytest.mark.parametrize("path", SHIPPED_RECIPES + SHIPPED_SUITES)
def test_every_shipped_recipe_and_suite_fits_the_hardware_it_names(path):
    plan = make_plan(path, [])
    assert plan.problems == []
    assert plan.rows


def test_the_index_is_searched_in_host_memory_unless_faiss_is_a_gpu_build():
    """The GPU set ships faiss-cpu (no FAISS GPU wheel for vLLM's CUDA), so `to_gpus` leaves the flat index in host
    memory; with `hardware.faiss_gpu` it is fp16 split over all 8 GPUs (21,015,324 x 768 x 2 bytes / 8 + scratch)."""
    def gpu_sums(plan):
        return {row.where: row.per_device for row in plan.rows if row.process == "all of the above, summed"}

    host = make_plan("recipes/teacher/qwen3-32b.yaml", [])
    assert not any("split over every GPU" in row.process for row in host.rows)
    assert any(row.process.startswith("FAISS index (host") and row.where == "host" for row in host.rows)
    assert gpu_sums(host)["GPU 4-7"] == 0
    gpus = make_plan("recipes/teacher/qwen3-32b.yaml", ["hardware.faiss_gpu=true"])
    shard = 21_015_324 * 768 * 2 / 8 + memory.FAISS_TEMP_BYTES
    assert gpu_sums(gpus)["GPU 4-7"] == pytest.approx(shard)
    assert gpu_sums(gpus)["GPU 1-3"] == pytest.approx(gpu_sums(host)["GPU 1-3"] + shard)


def test_engines_whose_shares_sum_to_one_gpu_are_refused_with_the_reason(tmp_path):
    """Issue 63: two engines at 0.5 of one 80 GB GPU sum to exactly 1.0 of it, which the plan passed; vLLM starts an
    engine only where the free memory, read after its own CUDA context is up, is at least utilization x total, so
    the second would refuse. The plan refuses in one line naming the contexts and vLLM's check; on two GPUs each
    engine gets its own. One engine at 0.995 leaves no room for its own context."""
    recipe = tmp_path / "two.yaml"
    recipe.write_text("name: two\nroles:\n  default: {backend: vllm, model: Qwen/Qwen3-0.6B}\n"
                      "  proposer: {backend: vllm, model: Qwen/Qwen3-1.7B}\n"
                      "backend: {tensor_parallel_size: 1, gpu_memory_utilization: 0.5}\n"
                      "retrieval: {kind: bm25}\n", encoding="utf-8")  # no encoder on GPU 0: the engines alone
    problems = make_plan(str(recipe), [], gpus=1, gpu_memory_gb=80).problems
    (problem,) = [p for p in problems if " GPU 0 holds " in p]
    assert "GPU 0 holds 82.0 GB (engines at their gpu_memory_utilization with 1.0 GB of CUDA context each" in problem
    assert "vLLM refuses to start an engine where the free memory is under utilization x total" in problem
    assert "\n" not in problem
    assert not [p for p in make_plan(str(recipe), [], gpus=2, gpu_memory_gb=80).problems if "holds" in p]
    alone = make_plan(str(recipe), ["roles.proposer.backend=hf", "backend.gpu_memory_utilization=0.995"], gpus=1,
                      gpu_memory_gb=80).problems
    assert any("leaves no room for its CUDA context (1.0 GB, outside that share)" in p and
               p.endswith("lower backend.gpu_memory_utilization to at most 0.99") for p in alone)
    served = make_plan("recipes/distill/qwen3-0.6b.yaml", ["serve.gpu_memory_utilization=0.995"], gpus=1,
                       gpu_memory_gb=80).problems
    assert [p for p in served if p.startswith("serve: ") and "leaves no room for its CUDA context" in p
            and p.endswith("lower serve.gpu_memory_utilization to at most 0.99")]


def test_the_recipe_hardware_is_the_default_and_the_command_line_wins():
    recipe_hw = make_plan("recipes/distill/qwen3-4b.yaml", []).hardware
    assert (recipe_hw.gpus, recipe_hw.gpu_memory_gb) == (8, 80)
    assert make_plan("recipes/distill/qwen3-4b.yaml", [], gpus=2).hardware.gpus == 2


def test_a_suite_is_planned_system_by_system_as_its_engine_pool_runs_it(tmp_path):
    """The suite's engine pool closes a finished system's engines before one that would not fit beside them starts
    (maps_train/llm/pool.py), so the distill suite's teacher (GPUs 0-3 at 0.85) and students (at 0.85) pass one
    system at a time. A system with a second model at the teacher's tensor parallelism is placed as the pool places
    it, on the free GPUs 4-7, and fits; one with a third such model finds no free GPUs and crowds GPUs 0-3."""
    assert make_plan("eval/suites/distill.yaml", []).problems == []
    suite = (REPO / "eval" / "suites" / "distill.yaml").read_text(encoding="utf-8").replace(
        "recipe: recipes/", f"recipe: {REPO}/recipes/")
    packed = suite.replace("overrides: [agent.method=vanilla]",
                           "overrides: [agent.method=vanilla, roles.answer.model=Qwen/Qwen3-8B]", 1)
    crowded = suite.replace("overrides: [agent.method=vanilla]", "overrides: [agent.method=vanilla, "
                            "roles.answer.model=Qwen/Qwen3-8B, roles.writer.model=Qwen/Qwen3-14B]", 1)
    assert crowded != suite and packed != suite
    (tmp_path / "packed.yaml").write_text(packed, encoding="utf-8")
    plan = make_plan(str(tmp_path / "packed.yaml"), [])
    assert plan.problems == []
    engines = [row for row in plan.rows if row.stage.startswith("eval teacher_vanilla_rag")
               and row.process.startswith("vLLM")]
    assert [row.where for row in engines] == ["GPU 0-3", "GPU 4-7"]
    path = tmp_path / "crowded.yaml"
    path.write_text(crowded, encoding="utf-8")
    problems = make_plan(str(path), []).problems
    # the third engine has no GPU with room left: it lands on GPUs 0-3 beside the teacher, both at 0.85 and each
    # with its CUDA context outside that share (1 GB)
    assert [problem.split(" (")[0] for problem in problems] == [
        "eval teacher_vanilla_rag: GPU 0 holds 138.8 GB", "eval teacher_vanilla_rag: GPU 1-3 hold 138.0 GB each"]
    assert all("over 80 GB" in problem and "index split" not in problem for problem in problems)


def test_reads_a_local_config_json(tiny_qwen3):
    """A local folder is sized from its own config.json: the count equals the tensors saved in its safetensors."""
    shape = model_shape(tiny_qwen3)
    config = json.loads((Path(tiny_qwen3) / "config.json").read_text(encoding="utf-8"))
    assert (shape.hidden_size, shape.num_hidden_layers, shape.head_dim) == (64, 2, 16)
    assert shape.vocab_size == config["vocab_size"] and shape.source.endswith("config.json")
    saved = 0
    with safe_open(str(Path(tiny_qwen3) / "model.safetensors"), framework="numpy") as weights:
        for name in weights.keys():
            count = 1
            for size in weights.get_slice(name).get_shape():
                count *= size
            saved += count
    assert shape.parameters() == saved
    assert model_shape("builtin:tiny-qwen3").parameters() == saved


def test_a_model_with_no_sizes_at_hand_is_one_line(tmp_path):
    with pytest.raises(MapsTrainError) as err:
        model_shape("someone/unknown-model")
    assert "\n" not in str(err.value) and "Qwen/Qwen3-32B" in str(err.value)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}), encoding="utf-8")
    with pytest.raises(MapsTrainError, match="config.json has no integer num_hidden_layers"):
        model_shape(str(tmp_path))


def _app():
    from maps_train.cli import app

    return app


# ---- the RL stage ---------------------------------------------------------------------------------------------

RL_4B = "recipes/distill/qwen3-4b.yaml"


def test_the_rl_rank_of_the_4b_recipe_by_hand():
    """One GRPO rank of the 8-GPU recipe, from Qwen3-4B's config (h 2560, 32 x 128 query, 8 x 128 KV, MLP 9728,
    36 layers, 151,936 vocabulary): base in bf16; LoRA r64 (dropout 0.05) in fp32 with gradients and Adam's two
    moments, plus TRL's fp32 "ref" copy (distilled start, beta 0.04); checkpointed activations of 8 rows x 8192
    tokens (each layer's bf16 input, one layer recomputed and its gradients); TRL's fused LM head over the 8 x 512
    completion positions (one 4096 x 32768 bf16 tile, the scored hidden states, their fp32 and bf16 gradients, the
    gradient of all 8 x 8192 hidden states, 12 fp32 values a scored position); 2 GB of runtime; and TRL's colocated
    engine at 0.30 of 80 GB."""
    h, q, kv, i, r, layers, vocab = 2560, 4096, 1024, 9728, 64, 36, 151_936
    shape = model_shape("Qwen/Qwen3-4B")
    lora = r * layers * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h))
    assert shape.lora_parameters(r) == lora
    layer = 2 * ((2 * h + 4 * q + 4 * kv) + (2 * h + 4 * i) + 7 * r + (5 * h + q + i)) + (5 * h + q + i)
    activations = 8 * 8192 * (layers * 2 * h + 2 * layer)
    head = 4096 * 32768 * 2 + 8 * 512 * h * (2 + 4 + 2) + 8 * 8192 * h * 2 + 8 * 512 * 12 * 4
    assert vocab > 32768  # the tile spans 32768 of the vocabulary, never all of it
    rank = shape.parameters() * 2 + lora * (4 + 12 + 4) + activations + head + 2e9
    plan = make_plan(RL_4B, [])
    rows = [row for row in plan.rows if row.stage == "rl consolidator"]
    assert [row.process for row in rows] == ["GRPO rank Qwen/Qwen3-4B LoRA r64",
                                             "TRL's colocated vLLM Qwen/Qwen3-4B (LoRA merged)",
                                             "retrieval service for the machine's ranks (FAISS index)",
                                             "all of the above, summed"]
    assert rows[0].per_device == pytest.approx(rank)
    assert rows[1].budget == pytest.approx(0.30 * 80e9)
    # the ranks' one retrieval service: wiki-18's fp32 flat index in host memory, its E5 encoder on GPU 0
    assert rows[2].where == "host" and rows[2].per_device == 21_015_324 * 768 * 4
    encoder = model_shape("intfloat/e5-base-v2").parameters() * 2 + 0.5e9
    assert rows[3].per_device == pytest.approx(rank + 0.30 * 80e9 + encoder) and rows[3].per_device < 80e9
    assert 75e9 < rows[3].per_device < 80e9 and all(row.problem is None for row in rows)


def test_an_rl_rank_that_does_not_fit_is_refused_with_the_change_that_fits():
    """The colocated engine given 0.6 of the GPU and checkpointing off: over by tens of GB; the refusal names
    checkpointing and a quarter of the rows a device with four times the accumulation (the same 8 rows a step,
    still whole groups of G = 8), and that change fits."""
    as_written = ["rl.grpo.vllm_gpu_memory_utilization=0.6", "rl.grpo.gradient_checkpointing=false"]
    (problem,) = [p for p in make_plan(RL_4B, as_written).problems if p.startswith("rl")]
    assert problem.startswith("rl consolidator: each training GPU holds ") and "\n" not in problem
    assert "TRL's colocated engine 48.0 GB" in problem and "over 80.0 GB" in problem
    advice = problem.split("; set ")[1].removesuffix(" (the same rows a step)").split()
    assert advice == ["rl.grpo.gradient_checkpointing=true", "rl.grpo.per_device_train_batch_size=2",
                      "rl.grpo.gradient_accumulation_steps=4"]
    assert not [p for p in make_plan(RL_4B, [*as_written, *advice]).problems if p.startswith("rl")]


def test_a_colocated_engine_smaller_than_its_model_is_refused():
    """At 0.1 of 80 GB (8 GB) TRL's engine cannot hold Qwen3-4B's 8 GB of bf16 weights and its runtime: vLLM
    would stop at start-up, after the trainer loaded."""
    problems = [p for p in make_plan(RL_4B, ["rl.grpo.vllm_gpu_memory_utilization=0.1"]).problems
                if p.startswith("rl")]
    assert len(problems) == 1 and "TRL's colocated engine needs" in problems[0]
    assert problems[0].endswith("raise rl.grpo.vllm_gpu_memory_utilization or lower rl.grpo.vllm_max_model_length")


def test_an_in_process_environment_engine_is_counted_on_gpu_0():
    """rl.environment distilled on one GPU: the student's engine with its 3 adapters (backend's
    gpu_memory_utilization) beside the rank and TRL's engine: GPU 0 is planned as their sum."""
    plan = make_plan(RL_4B, ["rl.environment=distilled", "backend.gpu_memory_utilization=0.5"], gpus=1)
    rows = [row for row in plan.rows if row.stage.startswith("rl consolidator")]
    (environment,) = [row for row in rows if row.stage == "rl consolidator (environment)"]
    assert environment.process == "vLLM Qwen/Qwen3-4B (tp 1, 3 LoRA)" and environment.budget == pytest.approx(40e9)
    (summed,) = [row for row in rows if row.process == "all of the above, summed"]
    encoder = model_shape("intfloat/e5-base-v2").parameters() * 2 + 0.5e9  # the ranks' retrieval service's
    engine = 40e9 + ENGINE_CONTEXT_BYTES  # its share, and its process's CUDA context outside it
    assert summed.where == "GPU 0" and summed.per_device == pytest.approx(rows[0].per_device + 24e9 + engine + encoder)
    assert summed.problem and "the environment's engine 41.0 GB" in summed.problem


def test_a_gpu_that_holds_only_environment_engines_is_refused_for_them_alone():
    """rl.environment recipe with two tensor-parallel-4 engines (the 32B teacher and an 8B writer, each at 0.85 of
    GPUs 0-3): GPUs 1-3 hold no GRPO rank and no TRL engine, so their refusal counts and names the environment's
    engines only."""
    plan = make_plan(RL_4B, ["rl.environment=recipe", "roles.writer={backend: vllm, model: Qwen/Qwen3-8B}"])
    problems = [p for p in plan.problems if p.startswith("rl consolidator: GPU ")]
    assert [p.split(" holds ")[0] for p in problems] == [f"rl consolidator: GPU {gpu}" for gpu in range(4)]
    for problem in problems[1:]:
        assert "holds 138.0 GB (the environment's engine 138.0 GB), 58.0 GB over 80.0 GB" in problem
        assert problem.endswith("lower backend.gpu_memory_utilization or serve the environment "
                                "(rl.environment: server)")
    assert "the GRPO step at 8 x 8192 tokens 54.3 GB, TRL's colocated engine 24.0 GB" in problems[0]


# ---- Qwen3.6 from its own config.json ---------------------------------------------------------------------------

QWEN36 = REPO / "tests" / "fixtures" / "qwen3.6-35b-a3b"


def test_qwen3_6_is_sized_from_its_own_config_json():
    """Qwen3.6-35B-A3B's config.json (tests/fixtures/qwen3.6-35b-a3b, written by transformers' Qwen3.5-MoE classes)
    nests the language model under text_config and has no intermediate_size: the plan reads its experts' width
    instead, and the count is the shipped one. 40 layers, 10 of them full attention (layer_types), 256 experts of
    512 plus a shared one of 512, untied 248,320 x 2048 embeddings."""
    config = json.loads((QWEN36 / "config.json").read_text(encoding="utf-8"))
    assert "intermediate_size" not in config["text_config"]
    shape = model_shape(str(QWEN36))
    assert (shape.num_experts, shape.moe_intermediate_size, shape.attention_layers) == (256, 512, 10)
    assert shape.parameters() == model_shape("Qwen/Qwen3.6-35B-A3B").parameters()
    h, q, kv = 2048, 16 * 256, 2 * 256
    attention = h * 2 * q + 2 * h * kv + q * h + 2 * 256  # q doubled by the output gate, k, v, o, q/k norms
    keys, values = 16 * 128, 32 * 128
    linear = h * (2 * keys + 2 * values) + h * 2 * 32 + (2 * keys + values) * 4 + values * h
    mlp = 256 * 3 * h * 512 + 3 * h * 512 + h * 256
    by_hand = 10 * attention + 30 * linear + 40 * (mlp + 2 * h) + 2 * 248_320 * h + h
    assert shape.parameters() == by_hand and 34e9 < by_hand < 36e9
    roles = ("default", "answer", "generator", "reasoner")
    plan = make_plan("recipes/paper/qwen3.6-35b-a3b.yaml", [f"roles.{role}.model={QWEN36}" for role in roles])
    assert plan.problems == []
    (engine,) = [row for row in plan.rows if row.process.startswith("vLLM ")]
    assert engine.note.startswith("weights 34.7 GB")  # tensor parallel 2: 69.4 GB of bf16 over two GPUs


# ---- the machine it runs on -------------------------------------------------------------------------------------

def _fake_nvidia_smi(folder: Path, mib: list[int]) -> str:
    """A PATH holding an `nvidia-smi` that answers the memory query as the real one does (index, MiB)."""
    script = folder / "nvidia-smi"
    lines = "".join(f"{index}, {size}\\n" for index, size in enumerate(mib))
    script.write_text(f"#!/bin/sh\nprintf '{lines}'\n", encoding="utf-8")
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_the_plan_warns_when_this_machine_has_fewer_or_smaller_gpus(tmp_path, monkeypatch):
    """The 4B recipe states 8 x 80 GB. On a machine whose nvidia-smi shows one 81,559 MiB GPU (85.5 GB) the plan
    still plans the stated machine but warns in one line; with CUDA_VISIBLE_DEVICES naming 8 of 8 such GPUs it says
    nothing; 8 x 40,960 MiB (42.9 GB) are smaller and warned about; `maps-train train` warns the same way."""
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, [81559]))
    result = CliRunner().invoke(_app(), ["plan", "recipes/distill/qwen3-4b.yaml"])
    assert result.exit_code == 0
    (warning,) = result.stderr.splitlines()
    assert warning.startswith("maps-train: warning: this machine has 1 GPU(s), the smallest 85.5 GB, fewer or "
                              "smaller than the 8 x 80 GB the plan is for")
    (tmp_path / "eight").mkdir()
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "eight", [81559] * 8))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert CliRunner().invoke(_app(), ["plan", "recipes/distill/qwen3-4b.yaml"]).stderr == ""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert "this machine has 2 GPU(s)" in CliRunner().invoke(_app(), ["plan", "recipes/distill/qwen3-4b.yaml"]).stderr
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    (tmp_path / "small").mkdir()
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path / "small", [40960] * 8))
    from maps_train.plan.preflight import check_stage

    warnings = []
    check_stage("serve", "recipes/distill/qwen3-4b.yaml", [], warn=warnings.append)
    assert warnings == [warning.replace("maps-train: warning: this machine has 1 GPU(s), the smallest 85.5 GB",
                                        "maps-train: warning: serve: this machine has 8 GPU(s), the smallest 42.9 GB")]
