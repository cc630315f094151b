"""GPU day one: `maps-train plan`'s figures against what one GPU measures, on randomly initialised real shapes.

Run by bench/gpu_day_one.sh after it installs the GPU set. No weights are downloaded: every model is built from
the shipped config values (maps_train/plan/models/*.json) with random weights, which allocate exactly as trained
ones do. Three checks, one table:

- LoRA SFT through TRL's SFTTrainer (the real trainer: PEFT LoRA r64 on every projection, bf16, gradient
  checkpointing, completion-only loss through TRL's fused LM head) of Qwen3-0.6B, 1.7B and 4B at the distill
  recipes' batch x length (and Qwen3-0.6B at batch 32, issue 47's case): the peak torch's allocator reserved
  during the steps plus the CUDA context (`torch.cuda.mem_get_info` before any allocation), against the plan's rank
  (`plan.memory.train_memory`, whose 2 GB of runtime stands for the context and the allocator's slack);
- a vLLM engine of a random Qwen3-0.6B with three random LoRA adapters (r64) at gpu_memory_utilization 0.85: the
  GPU memory it took and the tokens its KV cache holds, against the plan's budget and KV count;
- FAISS: a flat index of random unit vectors searched in host memory in fp32 and fp16 (and on the GPU where FAISS
  is a GPU build): queries/s, against the plan's choice of precision.

    python bench/gpu_day_one.py                 # on a GPU (about 5 minutes on one H200)
    python bench/gpu_day_one.py --plan-only     # anywhere: the planned column only (tests/test_gpu_day_one.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GB = 1e9
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# (model, per-device batch, max_length): the distill recipes' settings, and issue 47's batch-32 case
SFT_CASES = [("Qwen/Qwen3-0.6B", 8, 4096), ("Qwen/Qwen3-0.6B", 32, 4096), ("Qwen/Qwen3-1.7B", 8, 4096),
             ("Qwen/Qwen3-4B", 8, 4096)]
LORA_RANK, LORA_DROPOUT = 64, 0.05
COMPLETION_SHARE = 0.25  # a role call's completion is 10-25% of its row: the labelled share of each synthetic row
ENGINE = dict(model="Qwen/Qwen3-0.6B", adapters=3, max_lora_rank=64, max_model_len=8192, utilization=0.85)
FAISS_CASE = dict(passages=1_000_000, dim=768, queries=256, k=10)


@dataclass
class Line:
    check: str
    planned: str
    measured: str = "-"
    ratio: str = "-"


def planned_sft(model: str, batch: int, max_length: int) -> float:
    """The plan's bytes for one rank (no ZeRO, one machine), every position labelled (its upper bound)."""
    from maps_train.plan import memory
    from maps_train.plan.shapes import model_shape

    return memory.train_memory(model_shape(model), batch=batch, max_length=max_length, lora_rank=LORA_RANK,
                               lora_dropout=LORA_DROPOUT, checkpointing=True, bf16=True, world=1,
                               zero_stage=0).total


def planned_engine(gpu_gb: float) -> tuple[float, int]:
    """(the engine's budget in bytes, the tokens its KV cache holds by the plan) on a GPU of `gpu_gb`."""
    from maps_train.plan import memory
    from maps_train.plan.shapes import model_shape

    budget = ENGINE["utilization"] * gpu_gb * GB
    mem = memory.engine_memory(model_shape(ENGINE["model"]), tensor_parallel=1, max_model_len=ENGINE["max_model_len"],
                               max_loras=ENGINE["adapters"], max_lora_rank=ENGINE["max_lora_rank"], budget=budget)
    kv_tokens = int((budget - mem.fixed) / memory.kv_bytes_per_token(model_shape(ENGINE["model"]), 1))
    return budget, kv_tokens


def planned_lines(gpu_gb: float, host_gb: float) -> list[Line]:
    from maps_train.retrieval.faiss_index import flat_precision

    lines = [Line(f"train {model.split('/')[1]} LoRA r64, {batch} x {length}, checkpointing",
                  f"{planned_sft(model, batch, length) / GB:.1f} GB") for model, batch, length in SFT_CASES]
    budget, kv_tokens = planned_engine(gpu_gb)
    lines.append(Line(f"vLLM {ENGINE['model'].split('/')[1]} + 3 LoRA r64 at {ENGINE['utilization']}: GPU memory",
                      f"{budget / GB:.1f} GB"))
    lines.append(Line("vLLM same engine: KV cache tokens", f"{kv_tokens:,}"))
    case = FAISS_CASE
    precision = flat_precision(case["passages"], case["dim"], host_gb * GB)
    lines.append(Line(f"FAISS flat {case['passages']:,} x {case['dim']} in host memory: precision", precision))
    return lines


# ---- measurements (GPU) -------------------------------------------------------------------------------------

CONTEXT = {"bytes": 0.0}  # this process's CUDA context and kernels, measured before anything is allocated


def measure_context() -> None:
    import torch

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    CONTEXT["bytes"] = total - free - torch.cuda.memory_reserved()


def measure_sft(model_name: str, batch: int, max_length: int, steps: int, workdir: Path) -> float:
    """Peak GPU bytes of `steps` SFTTrainer steps: the peak torch's allocator reserved (what it allocated and its
    slack) plus the CUDA context, both of which the plan's 2 GB of runtime stands for."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from tokenizers import Tokenizer, models
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from maps_train.plan.shapes import shipped

    values = dict(shipped()[model_name.lower()]["config"])
    config = AutoConfig.for_model(values.pop("model_type"), **{k: v for k, v in values.items() if k != "torch_dtype"})
    config.pad_token_id, config.eos_token_id = 0, 1
    torch.cuda.empty_cache()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>")),
        pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    completion = int(max_length * COMPLETION_SHARE)
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(3, config.vocab_size, (max_length,), generator=generator).tolist(),
             "completion_mask": [0] * (max_length - completion) + [1] * completion} for _ in range(batch * steps)]
    trainer = SFTTrainer(
        model=model, processing_class=tokenizer, train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=LORA_DROPOUT,
                               target_modules=TARGETS, task_type="CAUSAL_LM"),
        args=SFTConfig(output_dir=str(workdir / "sft"), max_steps=steps, save_strategy="no", logging_steps=1,
                       per_device_train_batch_size=batch, max_length=max_length, bf16=True,
                       gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False},
                       report_to="none", completion_only_loss=True, dataloader_num_workers=0, seed=0))
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    peak = torch.cuda.max_memory_reserved()  # the allocator's peak, its unallocated slack included
    del trainer, model
    torch.cuda.empty_cache()
    return peak + CONTEXT["bytes"]


def random_qwen3_folder(folder: Path, adapters: int) -> tuple[Path, list[Path]]:
    """A random Qwen3-0.6B saved as safetensors and `adapters` random LoRA r64 adapters beside it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from maps_train.plan.shapes import shipped

    values = dict(shipped()[ENGINE["model"].lower()]["config"])
    config = AutoConfig.for_model(values.pop("model_type"), **{k: v for k, v in values.items() if k != "torch_dtype"})
    config.eos_token_id = 1
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    base = folder / "base"
    model.save_pretrained(base)
    folders = []
    for index in range(adapters):
        peft = get_peft_model(model, LoraConfig(r=ENGINE["max_lora_rank"], lora_alpha=128, target_modules=TARGETS,
                                                task_type="CAUSAL_LM", init_lora_weights=False))
        peft.save_pretrained(folder / f"adapter{index}")
        folders.append(folder / f"adapter{index}")
        model = peft.unload()
    return base, folders


def measure_engine(workdir: Path) -> tuple[float, int | None, float]:
    """(GPU bytes the engine took, its KV cache tokens, seconds to start): vLLM in this process."""
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    base, adapters = random_qwen3_folder(workdir / "engine", ENGINE["adapters"])
    torch.cuda.empty_cache()
    free_before, _ = torch.cuda.mem_get_info()
    start = time.perf_counter()
    llm = LLM(model=str(base), skip_tokenizer_init=True, enable_lora=True, max_loras=ENGINE["adapters"],
              max_lora_rank=ENGINE["max_lora_rank"], max_model_len=ENGINE["max_model_len"],
              gpu_memory_utilization=ENGINE["utilization"], dtype="bfloat16")
    started = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=list(range(3, 3 + 512)))] * 4
    params = SamplingParams(max_tokens=32, temperature=0.0, detokenize=False)
    for index, folder in enumerate(adapters):
        llm.generate(prompts, params, lora_request=LoRARequest(f"a{index}", index + 1, str(folder)))
    taken = free_before - torch.cuda.mem_get_info()[0]
    blocks = None
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None
    except AttributeError:
        pass
    del llm
    return taken, blocks, started


def measure_faiss() -> dict[str, float]:
    import faiss
    import numpy as np

    case = FAISS_CASE
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((case["passages"], case["dim"]), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    embeddings = vectors.astype(np.float16)
    queries = vectors[: case["queries"]] + 0.01
    fp32 = faiss.IndexFlatIP(case["dim"])
    fp32.add(embeddings.astype(np.float32))
    del vectors
    from maps_train.retrieval.faiss_index import flat_fp16_index, gpu_count

    rates = {}
    for name, index in (("fp32", fp32), ("fp16", flat_fp16_index(embeddings, 65_536))):
        start = time.perf_counter()
        index.search(queries, case["k"])
        rates[name] = case["queries"] / (time.perf_counter() - start)
    if gpu_count():
        gpu = faiss.index_cpu_to_all_gpus(fp32)
        gpu.search(queries, case["k"])
        start = time.perf_counter()
        gpu.search(queries, case["k"])
        rates["gpu"] = case["queries"] / (time.perf_counter() - start)
    return rates


def format_table(lines: list[Line]) -> str:
    header = Line("check", "planned", "measured", "measured / planned")
    rows = [header, *lines]
    widths = [max(len(getattr(row, field)) for row in rows) for field in ("check", "planned", "measured")]
    return "\n".join(f"{row.check:<{widths[0]}}  {row.planned:>{widths[1]}}  {row.measured:>{widths[2]}}  {row.ratio}"
                     for row in rows) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plan-only", action="store_true", help="Print the planned column only (no GPU needed).")
    parser.add_argument("--gpu-memory-gb", type=float, default=None, help="Default: this GPU's (141 on an H200).")
    parser.add_argument("--host-memory-gb", type=float, default=None, help="Default: this machine's memory.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None, help="Also write the table as JSON here.")
    args = parser.parse_args()

    from maps_train.retrieval.faiss_index import host_memory_bytes

    host_gb = args.host_memory_gb or host_memory_bytes() / GB
    gpu_gb = args.gpu_memory_gb
    if not args.plan_only:
        import torch

        if not torch.cuda.is_available():
            print("gpu_day_one: no CUDA device; run with --plan-only off a GPU", file=sys.stderr)
            return 2
        gpu_gb = gpu_gb or torch.cuda.get_device_properties(0).total_memory / GB
    gpu_gb = gpu_gb or 80.0
    lines = planned_lines(gpu_gb, host_gb)
    if not args.plan_only:
        measure_context()
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            for line, (model, batch, length) in zip(lines, SFT_CASES):
                try:
                    measured = measure_sft(model, batch, length, args.steps, workdir)
                    line.measured = f"{measured / GB:.1f} GB"
                    line.ratio = f"{measured / planned_sft(model, batch, length):.2f}"
                except Exception as err:  # one failed case (out of memory) must not hide the others' rows
                    line.measured = f"failed: {type(err).__name__}"
                print(format_table(lines[: len(SFT_CASES)]), flush=True)
            engine, kv = lines[len(SFT_CASES)], lines[len(SFT_CASES) + 1]
            try:
                taken, tokens, started = measure_engine(workdir)
                budget, kv_tokens = planned_engine(gpu_gb)
                engine.measured, engine.ratio = f"{taken / GB:.1f} GB", f"{taken / budget:.2f} (start {started:.0f} s)"
                if tokens:
                    kv.measured, kv.ratio = f"{tokens:,}", f"{tokens / kv_tokens:.2f}"
            except Exception as err:
                engine.measured = f"failed: {type(err).__name__}: {str(err)[:80]}"
        rates = measure_faiss()
        faiss_line = lines[-1]
        faiss_line.measured = ", ".join(f"{name} {rate:,.0f} q/s" for name, rate in rates.items())
        faiss_line.ratio = f"fp32/fp16 {rates['fp32'] / rates['fp16']:.1f}x"
    table = format_table(lines)
    print(f"plan: {gpu_gb:.0f} GB GPU, {host_gb:.0f} GB host\n" + table, end="")
    if args.json:
        Path(args.json).write_text(json.dumps([line.__dict__ for line in lines], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its config readable
    sys.exit(main())
