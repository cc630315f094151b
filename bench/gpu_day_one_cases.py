"""One case of the GPU day-one check (bench/gpu_day_one.py), measured in this process and printed as one JSON line.

The driver starts this file once per case, so each case runs in a fresh process: TRL's `model.forward` rebinding
makes a reference cycle that keeps an earlier case's model alive until `gc.collect()`, which in one process
inflated the later rows' peak memory.

    python bench/gpu_day_one_cases.py '{"case": "sft", "model": "Qwen/Qwen3-0.6B", "batch": 8, "length": 4096,
                                        "checkpointing": true, "device": "cuda", "tiny": false, "steps": 3}'

Cases: `context` (this process's CUDA context), `sft` (LoRA SFT steps through TRL's SFTTrainer on a randomly
initialised model of a shipped config: peak memory and tokens/s), `grpo` (GRPO policy steps through TRL's
GRPOTrainer, generating with transformers, no vLLM), `faiss` (flat index search), `engine` (a vLLM engine with
three LoRA adapters). The last line of stdout is `ROW {json}`; a case that fails prints `ROW` with its error.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RANK, LORA_DROPOUT = 64, 0.05  # the distill recipes' train.lora
COMPLETION_SHARE = 0.25  # a role call's completion is 10-25% of its row: the labelled share of each synthetic row
# --tiny: the same code path on a 2-layer Qwen3 (CPU rehearsal); the shipped configs otherwise
TINY = dict(model_type="qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=2048, tie_word_embeddings=True)


def model_values(model: str, tiny: bool) -> dict:
    """The config values of `model` as shipped in maps_train/plan/models (TINY's with --tiny)."""
    from maps_train.plan.shapes import shipped

    values = dict(TINY if tiny else shipped()[model.lower()]["config"])
    values.pop("torch_dtype", None)
    return values


def build_config(values: dict):
    from transformers import AutoConfig

    values = dict(values)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    config.pad_token_id, config.eos_token_id = 0, 1
    return config


def word_tokenizer(vocab_size: int):
    """A tokenizer whose every id is one word `w{id}` (ids 0-2 the pad, eos and unk): what the trainers need of a
    tokenizer (pad id, encode and decode) for rows that are token ids already."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


class StepTimer:
    """Seconds of each optimizer step, the device synchronised at both ends (a TrainerCallback)."""

    def __init__(self, cuda: bool):
        from transformers import TrainerCallback

        timer, self.cuda, self.seconds = self, cuda, []

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.sync()
                timer.start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                timer.sync()
                timer.seconds.append(time.perf_counter() - timer.start)

        self.callback = _Callback()

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def memory_start(cuda: bool) -> None:
    if cuda:
        import torch

        torch.cuda.reset_peak_memory_stats()


def peak_bytes(cuda: bool) -> tuple[float, str]:
    """(the peak, what it is): on a GPU the allocator's reserved peak plus this process's CUDA context (what the
    plan's 2 GB of runtime stands for); on the CPU the process's peak resident set."""
    if cuda:
        import torch

        return float(torch.cuda.max_memory_reserved() + context_bytes()), "GPU: allocator peak + CUDA context"
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), "host: peak RSS of the process"


def context_bytes() -> float:
    """What this process holds on the GPU outside torch's allocator: the CUDA context, cuBLAS handles, kernels."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return float(total - free - torch.cuda.memory_reserved())


def case_context(spec: dict) -> dict:
    import torch

    torch.zeros(1, device="cuda")
    (torch.ones(256, 256, device="cuda", dtype=torch.bfloat16) @ torch.ones(256, 256, device="cuda",
                                                                         dtype=torch.bfloat16)).sum().item()
    return {"measured_bytes": context_bytes(), "device_name": torch.cuda.get_device_name()}


def case_sft(spec: dict) -> dict:
    """LoRA SFT through TRL's SFTTrainer (PEFT LoRA r64 on every projection, completion-only loss, bf16 on a GPU):
    `steps` timed optimizer steps after one warm-up step, every row `length` tokens (the plan's worst batch), the
    last quarter labelled."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    cuda = spec["device"] == "cuda"
    config = build_config(model_values(spec["model"], spec["tiny"]))
    batch, length, steps = spec["batch"], spec["length"], spec["steps"]
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa")
    completion = int(length * COMPLETION_SHARE)
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(3, config.vocab_size, (length,), generator=generator).tolist(),
             "completion_mask": [0] * (length - completion) + [1] * completion} for _ in range(batch * (steps + 1))]
    timer = StepTimer(cuda)
    with tempfile.TemporaryDirectory() as out:
        trainer = SFTTrainer(
            model=model, processing_class=word_tokenizer(config.vocab_size), train_dataset=Dataset.from_list(rows),
            peft_config=LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, lora_dropout=LORA_DROPOUT,
                                   target_modules=TARGETS, task_type="CAUSAL_LM"),
            args=SFTConfig(output_dir=out, max_steps=steps + 1, save_strategy="no", logging_steps=1,
                           per_device_train_batch_size=batch, max_length=length, bf16=cuda, use_cpu=not cuda,
                           gradient_checkpointing=spec["checkpointing"],
                           gradient_checkpointing_kwargs={"use_reentrant": False}, report_to="none",
                           completion_only_loss=True, dataloader_num_workers=0, seed=0, disable_tqdm=True),
            callbacks=[timer.callback])
        memory_start(cuda)
        trainer.train()
    peak, what = peak_bytes(cuda)
    timed = timer.seconds[1:] or timer.seconds  # the first step warms up (kernels, allocator)
    tokens_per_s = batch * length * len(timed) / sum(timed)
    from gpu_sft_mfu import flops_per_token, parameter_counts

    per_token = flops_per_token(config, parameter_counts(config, LORA_RANK), length)
    return {"measured_bytes": peak, "measured_what": what, "tokens_per_s": tokens_per_s,
            "flops_per_token": per_token, "step_seconds": [round(s, 4) for s in timer.seconds]}


def case_grpo(spec: dict) -> dict:
    """GRPO policy steps through TRL's GRPOTrainer with generation by transformers (use_vllm false: no vLLM on the
    lent machine): random prompts of `prompt` tokens, `completion` new tokens, LoRA r64, a length reward."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    cuda = spec["device"] == "cuda"
    config = build_config(model_values(spec["model"], spec["tiny"]))
    with torch.device("cuda" if cuda else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if cuda else torch.float32,
                                                 attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(0)
    prompts = [" ".join(f"w{int(i)}" for i in torch.randint(3, config.vocab_size, (spec["prompt"],),
                                                             generator=generator)) for _ in range(64)]

    def length_reward(completions, **kwargs):
        return [float(len(c)) for c in completions]

    timer = StepTimer(cuda)
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model, reward_funcs=length_reward, processing_class=word_tokenizer(config.vocab_size),
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            peft_config=LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=TARGETS,
                                   task_type="CAUSAL_LM"),
            args=GRPOConfig(output_dir=out, max_steps=spec["steps"] + 1, save_strategy="no", logging_steps=1,
                            per_device_train_batch_size=spec["batch"], num_generations=spec["generations"],
                            max_completion_length=spec["completion"], bf16=cuda, use_cpu=not cuda,
                            use_vllm=False, gradient_checkpointing=True,
                            gradient_checkpointing_kwargs={"use_reentrant": False}, report_to="none",
                            dataloader_num_workers=0, seed=0, disable_tqdm=True),
            callbacks=[timer.callback])
        memory_start(cuda)
        trainer.train()
    peak, what = peak_bytes(cuda)
    timed = timer.seconds[1:] or timer.seconds
    return {"measured_bytes": peak, "measured_what": what, "step_seconds": [round(s, 4) for s in timer.seconds],
            "seconds_per_step": sum(timed) / len(timed)}


def case_faiss(spec: dict) -> dict:
    """A flat index of random unit vectors searched in host memory, fp32 (BLAS) and fp16 (the memmap's precision)."""
    import faiss
    import numpy as np

    from maps_train.retrieval.faiss_index import flat_fp16_index

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((spec["passages"], spec["dim"]), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[: spec["queries"]] + 0.01
    fp32 = faiss.IndexFlatIP(spec["dim"])
    fp32.add(vectors)
    rates = {}
    for name, index in (("fp32", fp32), ("fp16", flat_fp16_index(vectors.astype(np.float16), 65_536))):
        start = time.perf_counter()
        index.search(queries, spec["k"])
        rates[name] = spec["queries"] / (time.perf_counter() - start)
    return {"queries_per_s": rates}


def case_engine(spec: dict) -> dict:
    """A vLLM engine of a random Qwen3-0.6B with three random LoRA r64 adapters: GPU memory taken, KV tokens."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest

    config = build_config(model_values(spec["model"], False))
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(Path(tmp) / "base")
        folders = []
        for index in range(spec["adapters"]):
            peft = get_peft_model(model, LoraConfig(r=64, lora_alpha=128, target_modules=TARGETS,
                                                    task_type="CAUSAL_LM", init_lora_weights=False))
            peft.save_pretrained(Path(tmp) / f"adapter{index}")
            folders.append(Path(tmp) / f"adapter{index}")
            model = peft.unload()
        free_before = torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        llm = LLM(model=str(Path(tmp) / "base"), skip_tokenizer_init=True, enable_lora=True,
                  max_loras=spec["adapters"], max_lora_rank=64, max_model_len=spec["max_model_len"],
                  gpu_memory_utilization=spec["utilization"], dtype="bfloat16")
        started = time.perf_counter() - start
        prompts = [TokensPrompt(prompt_token_ids=list(range(3, 3 + 512)))] * 4
        params = SamplingParams(max_tokens=32, temperature=0.0, detokenize=False)
        for index, folder in enumerate(folders):
            llm.generate(prompts, params, lora_request=LoRARequest(f"a{index}", index + 1, str(folder)))
        taken = free_before - torch.cuda.mem_get_info()[0]
        cache = llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks * cache.block_size if cache.num_gpu_blocks else None
    return {"measured_bytes": float(taken), "kv_tokens": blocks, "start_seconds": started}


CASES = {"context": case_context, "sft": case_sft, "grpo": case_grpo, "faiss": case_faiss, "engine": case_engine}


def main() -> int:
    spec = json.loads(sys.argv[1])
    start = time.perf_counter()
    try:
        row = {"status": "measured", **CASES[spec["case"]](spec)}
    except Exception as err:  # the row says what failed; the driver goes on to the next case
        traceback.print_exc()
        row = {"status": "failed", "reason": f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"}
    row["wall_seconds"] = round(time.perf_counter() - start, 1)
    print("ROW " + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    import os

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: its config readable
    sys.exit(main())
