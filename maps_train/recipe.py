"""The recipe: one YAML file per experiment, one dataclass section per pipeline stage.

Every command reads the sections it needs from the same recipe, so a teacher run, its SFT sets, the student's
training and its serving are described in one place. A student recipe is an overlay on its teacher's
(`base: ../teacher/qwen3-32b.yaml`, see `maps_train.config.overlays`): it inherits the routes, retrieval and traces, so
every student reads the one teacher run. Field names are the YAML keys; see `recipes/` for examples and
`maps-train config show RECIPE` for the resolved (merged) values.

Every field says what it means (`metadata={"help": ...}`: `maps-train config show RECIPE --explain`). The code's
defaults are the demo world's, and a recipe states only its departures from them (tests/test_recipe_defaults_once.py).

`train.sft`, `train.lora` and `rl.grpo` are the keyword arguments of TRL's `SFTConfig`, PEFT's `LoraConfig` and
TRL's `GRPOConfig` as those libraries define them, checked against the libraries' own fields by the stage that
builds those objects (`maps_train.library_options.check_library_sections`); a section holds what the recipe sets
over maps-train's few departures, and every other option is the library's default.

Every name that becomes a folder or run name (the recipe's `name`, route and trace role names, adapter names, the
questions files whose names become trace folders) is checked when the recipe loads: one line naming the file and
the field, before any stage writes (or `train --overwrite` removes) anything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from maps_train.config.checks import (
    check_count,
    check_fields,
    check_finite_positive,
    check_fraction,
    check_gigabytes,
    check_positive,
    check_positive_or_null,
    check_weight,
)
from maps_train.config.names import plain_name_field, plain_name_keys, plain_name_problem
from maps_train.config.typed import FieldError, check_dataclass_kwargs
from maps_train.errors import ConfigError
from maps_train.library_options import (
    GRPO_DEFAULTS,
    LORA_DEFAULTS,
    SFT_DEFAULTS,
    check_grpo_options,
    check_lora_options,
    check_sft_options,
)
from maps_train.tracking import WandbConfig


@dataclass
class RetrievalConfig:
    """The passage index the agents search, how it is built and how it is reached."""

    corpus: str = field(default="data/demo/corpus.jsonl", metadata={"help": "The passages (JSONL: id, title, text)."})
    kind: Literal["dense", "bm25"] = field(default="dense", metadata={
        "help": "dense: FAISS over the encoder's embeddings; bm25: lexical search."})
    encoder: str = field(default="builtin:minilm-l6", metadata={
        "help": "The dense encoder (a builtin: name, a hub id or a folder)."})
    index_dir: str | None = field(default=None, metadata={
        "help": "The index from `maps-train index build`; null: $MAPS_TRAIN_HOME/indexes/<corpus>-<checksum>/."})
    index_type: Literal["flat", "hnsw", "ivfpq"] = field(default="flat", metadata={"help": "The FAISS index kind."})
    service_url: str | None = field(default=None, metadata={
        "help": "A running `maps-train retrieve serve`; null: search in process."})
    encode_batch_size: int = field(default=64, metadata={"help": "Passages or queries per encoder batch."})
    chunk_size: int = field(default=4096, metadata={"help": "Passages per resumable embedding chunk."})
    fp16: bool = field(default=True, metadata={"help": "Encode in float16 (on GPU only)."})
    hnsw_m: int = field(default=32, metadata={"help": "HNSW: neighbours per node."})
    ivf_nlist: int = field(default=4096, metadata={"help": "IVF-PQ: coarse clusters."})
    pq_m: int = field(default=64, metadata={"help": "IVF-PQ: sub-quantizers per vector."})
    nprobe: int = field(default=64, metadata={"help": "IVF-PQ: clusters searched per query."})
    query_prefix: str | None = field(default=None, metadata={
        "help": "Text put before each query; null: the encoder registry's (E5 'query: ', BGE's instruction, MiniLM "
                "none)."})
    passage_prefix: str | None = field(default=None, metadata={
        "help": "Text put before each passage; null: the encoder registry's (E5 'passage: ')."})
    embedding_dtype: Literal["float16", "float32"] = field(default="float16", metadata={
        "help": "The memory-mapped embedding matrix on disk."})
    hnsw_ef_construction: int = field(default=200, metadata={"help": "HNSW: candidates kept while building."})
    hnsw_ef_search: int = field(default=128, metadata={"help": "HNSW: candidates kept while searching."})
    auto_build: bool = field(default=True, metadata={
        "help": "Build a missing index (with a log line) instead of failing."})
    service_timeout_s: float = field(default=60.0, metadata={"help": "The retrieval client's request timeout."})
    service_max_batch: int = field(default=256, metadata={
        "help": "`retrieve serve`: most queries merged into one search call."})
    service_max_wait_ms: float = field(default=5.0, metadata={
        "help": "`retrieve serve`: how long the first request waits for others to join."})
    flat_precision: Literal["auto", "fp32", "fp16"] = field(default="auto", metadata={
        "help": "A flat index searched in host memory: fp32 (FAISS's BLAS search, several times faster) where it "
                "takes at most half the host's memory, else fp16 (half the memory); or either, forced."})
    search_threads: int | None = field(default=None, metadata={
        "help": "FAISS's CPU search threads in this process; null: the CPUs shared out over the ranks on this "
                "machine (LOCAL_WORLD_SIZE)."})

    @staticmethod
    def unknown_key_hint(key: str) -> str | None:
        """`top_k` is the agent's (agent.top_k: passages kept per search); the retriever is asked for it per call."""
        return "agent.top_k" if key == "top_k" else None


# The Qwen team's sampling for Qwen3 and Qwen3.6 (model cards, "Best Practices"; the thinking values are also the
# models' generation_config.json): thinking temperature 0.6, top_p 0.95, top_k 20, min_p 0; non-thinking 0.7, 0.8,
# 20, 0; presence_penalty between 0 and 2 where a model repeats itself. Greedy decoding is advised against in
# thinking mode (it repeats itself). The paper recipes state these on every route; see recipes/paper/.
QWEN3_SAMPLING = {
    "thinking": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0},
    "non_thinking": {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0},
}


@dataclass
class RoleRoute:
    """Where one role's calls go and how they are sampled.

    Sampling is sent in full to every backend (in-process vLLM, `vllm serve`, transformers), so none fills a field
    from the model's `generation_config.json` on its own: an unset top_k, min_p, presence_penalty or
    repetition_penalty is sent as its neutral value (no top-k, 0, 0, 1). temperature 0 is greedy (the default for
    code and tests); a recipe that decodes greedily says why beside it."""

    backend: Literal["vllm", "openai", "hf", "annotation"] = field(default="vllm", metadata={
        "help": "vllm: an in-process vLLM engine; openai: an OpenAI-compatible server (backend.base_urls); hf: "
                "transformers generate."})
    model: str = field(default="builtin:smollm2-135m-instruct", metadata={
        "help": "The model (a builtin: name, a hub id, a folder, or the served model name)."})
    adapter: str | None = field(default=None, metadata={
        "help": "A LoRA adapter folder (vllm, hf) or the served adapter name (openai); null: the base model."})
    temperature: float = field(default=0.0, metadata={"help": "Sampling temperature; 0 is greedy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass."})
    top_k: int | None = field(default=None, metadata={"help": "Sample from the k likeliest tokens; null or 0: no top-k."})
    min_p: float | None = field(default=None, metadata={"help": "Minimum token probability relative to the likeliest; null: 0."})
    presence_penalty: float | None = field(default=None, metadata={
        "help": "Penalty on tokens already generated, as vLLM and the OpenAI API define it; null: 0."})
    repetition_penalty: float | None = field(default=None, metadata={"help": "Multiplicative repetition penalty; null: 1."})
    max_tokens: int = field(default=256, metadata={"help": "Most tokens one call generates."})
    enable_thinking: bool = field(default=False, metadata={"help": "Qwen3's chat-template thinking switch."})
    structured: bool = field(default=True, metadata={
        "help": "Constrain the output with the role's JSON schema where the backend can."})
    seed: int | None = field(default=None, metadata={"help": "The route's sampling seed; null: none sent."})


@dataclass
class BackendConfig:
    """Engine and client settings shared by every route."""

    dtype: str = field(default="auto", metadata={
        "help": "The engines' weight dtype; auto on vLLM-CPU: bfloat16 where the CPU multiplies bf16, else float32."})
    max_model_len: int = field(default=4096, metadata={"help": "vLLM's context length (prompt and completion)."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs one teacher engine is split over."})
    gpu_memory_utilization: float = field(default=0.85, metadata={"help": "vLLM's share of each GPU's memory."})
    enforce_eager: bool = field(default=False, metadata={"help": "vLLM without CUDA graphs."})
    max_lora_rank: int = field(default=16, metadata={"help": "The largest LoRA rank a vLLM engine serves."})
    cpu_kv_cache_gib: int = field(default=2, metadata={"help": "vLLM-CPU's KV cache, in GiB."})
    base_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000/v1"], metadata={
        "help": "openai backend: the servers, requests spread over them."})
    api_key: str = field(default="", metadata={
        "help": "openai backend: keep it out of recipes; empty reads OPENAI_API_KEY from the environment (a local "
                "`vllm serve` without --api-key accepts anything). Shown as *** wherever a recipe is printed."})
    concurrency: int = field(default=32, metadata={"help": "openai backend: requests in flight per server."})
    request_timeout_s: float = field(default=120.0, metadata={
        "help": "openai backend: the timeout of connecting, sending a request and `GET /models`; how long a streamed "
                "answer may run is bounded by stall_timeout_s, not by this."})
    stall_timeout_s: float = field(default=120.0, metadata={
        "help": "openai backend: a streamed request is given up (cancelled, never resent) after this many seconds "
                "with no new token from it while its server's vLLM token counters (/metrics) did not move either; "
                "a request that keeps streaming, or waits on a server busy with others, has no time limit."})
    max_retries: int = field(default=4, metadata={
        "help": "openai backend: the SDK's own retries (timeouts, connection errors, 408/409/429, 5xx), with its own "
                "backoff (0.5 s doubling to 8 s, jittered; a server's Retry-After honoured)."})
    server_wait_s: float = field(default=0.0, metadata={
        "help": "openai backend: how long the first request to each server waits for its /health to answer (0: not "
                "at all), so a run may start while its server is still starting."})
    structured_disable_whitespace: bool = field(default=True, metadata={
        "help": "vLLM engine: JSON without free whitespace (engine-wide, xgrammar); small models otherwise loop on "
                "blank lines. For a server pass `--structured-outputs-config '{\"backend\": \"xgrammar\", "
                "\"disable_any_whitespace\": true}'`."})
    truncate_prompt: Literal["shrink", "error", "left"] = field(default="shrink", metadata={
        "help": "Prompts over the context: shrink what is least needed (oldest observations and turns, lowest-ranked "
                "passages, the middle of long text; never the system prompt or the question), error, or left (drop "
                "the oldest tokens: the system prompt and the question go first)."})
    reasoning_cap: Literal["answer", "none"] = field(default="answer", metadata={
        "help": "A call whose reasoning hits max_tokens inside <think>: answer closes the reasoning and asks for the "
                "answer with reasoning_cap_answer_tokens more (both on the question's cost); none keeps the empty "
                "answer."})
    reasoning_cap_answer_tokens: int = field(default=512, metadata={
        "help": "Tokens for the answer after a capped reasoning (at least 1).", "check": check_positive})
    language_model_only: bool = field(default=False, metadata={
        "help": "vLLM, a multimodal model run on text only (Qwen3.6): skip its vision encoder, whose memory goes to "
                "the KV cache."})
    vllm_engine: Literal["loop", "async"] = field(default="loop", metadata={
        "help": "vLLM in process: loop steps a vllm.LLM from one thread; async runs vLLM's AsyncLLM on its own event "
                "loop. Same tokens."})
    hf_batch_size: int = field(default=16, metadata={"help": "hf backend: prompts per generate call."})


@dataclass
class SamplingConfig:
    """What the agent puts on every request it sends, over its routes' sampling (null: the route's value)."""

    temperature: float | None = field(default=None, metadata={"help": "Every request's temperature; null: the route's."})
    top_p: float | None = field(default=None, metadata={"help": "Every request's top_p; null: the route's."})
    seed: int | None = field(default=None, metadata={
        "help": "Base seed. Each request's seed is derived from (seed, sample, question id, role, call index of that "
                "role in the question), so a run is reproducible whatever the batch size or a resume; null: no seed "
                "is sent."})
    sample: int = field(default=0, metadata={
        "help": "Which sample of a question this run is (`maps-train traces` sets it per sample folder)."})


@dataclass
class AgentConfig:
    """The agent: which method answers, its budgets and ablations."""

    method: Literal["maps", "vanilla", "search_o1", "parallel_search", "s3"] = field(default="maps", metadata={
        "help": "maps: the multi-agent parallel search; vanilla: one search then an answer (Vanilla RAG); "
                "search_o1, parallel_search, s3: the baselines."})
    num_directions: int = field(default=3, metadata={
        "help": "MAPS: N search directions per round; the no-parallelism ablation is N = 1."})
    max_rounds: int = field(default=10, metadata={"help": "MAPS: most search rounds per question."})
    min_rounds: int = field(default=1, metadata={
        "help": "MAPS: the rounds searched before the consolidator's stop is obeyed (1: from the first). A stop "
                "before it is recorded as the consolidator said it and the search goes on."})
    top_k: int = field(default=5, metadata={"help": "Passages kept per search."})
    use_directions: bool = field(default=True, metadata={
        "help": "MAPS: off is the 'no directions' ablation (the writer writes N sub-queries directly)."})
    decoupled: bool = field(default=True, metadata={
        "help": "MAPS: off is the 'no decoupling' ablation (every role also sees the full trajectory)."})
    answer_mode: Literal["auto", "short", "choice"] = field(default="auto", metadata={
        "help": "auto: choice when a question has options, else short."})
    batch_size: int = field(default=64, metadata={"help": "Questions advanced together (schedule step)."})
    schedule: Literal["auto", "continuous", "step"] = field(default="auto", metadata={
        "help": "step: batches of batch_size in lockstep; continuous: up to concurrency questions each on its own, "
                "calls batched by the engine as they come; auto: continuous when every engine takes concurrent calls "
                "(vllm, openai), else step."})
    concurrency: int | None = field(default=None, metadata={
        "help": "Questions in flight at once (schedule continuous); null: batch_size."})
    max_passage_words: int = field(default=120, metadata={"help": "Words of each passage shown in a prompt."})
    max_searches: int = field(default=10, metadata={"help": "search_o1, parallel_search, s3: most searches per question."})
    max_turns: int = field(default=15, metadata={"help": "search_o1, parallel_search, s3: most model turns per question."})
    prompts_dir: str | None = field(default=None, metadata={
        "help": "A folder of prompt files over the packaged ones; null: the packaged prompts."})
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata={
        "help": "Per-request sampling over the routes'."})
    hint: Literal["none", "gold_titles"] = field(default="none", metadata={
        "help": "Privileged hints, for teacher traces only (traces.hint sets it; evaluation refuses it): gold_titles "
                "adds to each writer call's direction the titles of the question's gold passages that its prompt "
                "already names and no search has found yet."})
    search_question: bool = field(default=False, metadata={
        "help": "MAPS: round 1 also searches the question itself, before the sub-queries (no model call). Off: the "
                "paper's MAPS, sub-queries only."})

    def __post_init__(self) -> None:
        if isinstance(self.max_rounds, bool) or not 1 <= self.max_rounds <= MAX_ROUNDS:
            raise ValueError(f"max_rounds must be from 1 to {MAX_ROUNDS}, got {self.max_rounds!r}")
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"min_rounds must be from 1 to max_rounds ({self.max_rounds}), got {self.min_rounds}")
        if self.min_rounds > 1 and self.method != "maps":
            unused_setting(f"agent.min_rounds: {self.min_rounds} is read by MAPS only; agent.method "
                           f"{self.method} never uses it")


MAX_ROUNDS = 100  # the paper searches at most 10; a bound, so a typo (1e9) is refused rather than run


def unused_setting(message: str) -> None:
    """One warning line, once a process, for a setting the chosen method never reads (a suite's shared overrides
    may set it for every system, so it is not refused)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("maps_train.recipe").warning("maps-train: warning: %s", message)


_WARNED: set[str] = set()


def check_questions_files(paths: list[str]) -> list[str]:
    """Each entry names a file: its name becomes a folder under traces.out_dir (`.`, `..` or `dir/` would not)."""
    for index, path in enumerate(paths):
        if Path(path).name in ("", ".", ".."):
            raise FieldError(f"[{index}]", f"{path!r} does not name a questions file")
    return paths


@dataclass
class TracesConfig:
    """`maps-train traces`: the teacher runs the agent over training questions and records every call."""

    questions: list[str] = field(default_factory=lambda: ["data/demo/train.jsonl"], metadata={
        "help": "Question files (JSONL); each file's name becomes a folder under out_dir.",
        "check": check_questions_files})
    out_dir: str = field(default="runs/traces", metadata={"help": "Where the traces go, one folder per questions file."})
    samples_per_question: int = field(default=1, metadata={
        "help": "Above 1: rejection sampling. Every request of sample k carries sample_temperature, top_p and a seed "
                "derived from (seed, k, question, role, call index); sft-data keeps the correct, distinct ones."})
    sample_temperature: float = field(default=0.7, metadata={"help": "Used when samples_per_question > 1."})
    top_p: float | None = field(default=None, metadata={
        "help": "Used when samples_per_question > 1; null: each route's top_p."})
    limit: int | None = field(default=None, metadata={"help": "First N questions of each file; null: all."})
    seed: int = field(default=0, metadata={"help": "Base seed of the sampled runs."})
    hint: Literal["none", "gold_titles"] = field(default="none", metadata={
        "help": "Rationalization (STaR): gold_titles shows the teacher's writer the gold passages' titles its prompt "
                "already names (agent.hint); the rows train on the prompt without them. Never an evaluation."})


TRAINER_SUBDIR = "_trainer"  # under train.output_dir: checkpoints and trainer state, kept out of the adapter folders


def check_adapter_roles(adapter_roles: dict[str, list[str]]) -> dict[str, list[str]]:
    """Adapter names become folders (`<sft>/<adapter>/`, `<train.output_dir>/<adapter>/`, which `train --overwrite`
    removes), so each is a plain name and none is the trainer's own folder; the roles are plain names too."""
    plain_name_keys(adapter_roles)
    for adapter, roles in adapter_roles.items():
        if adapter == TRAINER_SUBDIR:
            raise FieldError("", f"'{adapter}' is the folder of the trainer's checkpoints, not an adapter name")
        for role in roles:
            problem = plain_name_problem(role)
            if problem:
                raise FieldError(adapter, problem)
    return adapter_roles


@dataclass
class SFTDataConfig:
    """`maps-train sft-data`: which trace calls become training rows for which adapter."""

    traces_dir: str | None = field(default=None, metadata={
        "help": "The traces read; null: traces.out_dir (the teacher's traces, shared by every student)."})
    out_dir: str | None = field(default=None, metadata={
        "help": "Where the SFT sets go; null: <traces_dir>/sft/<key>, the key a hash of what decides the rows, so "
                "students whose rows would be the same share one set."})
    adapter_roles: dict[str, list[str]] = field(
        default_factory=lambda: {
            "proposer": ["proposer"],
            "writer": ["writer"],
            "consolidator": ["consolidator", "answer"],
        },
        metadata={"help": "Adapter -> the trace roles whose calls train it (plain names: adapters become folders).",
                  "check": check_adapter_roles},
    )
    filter: Literal["trace", "role"] = field(default="trace", metadata={
        "help": "trace: keep or drop a whole sample by its outcome (require_correct, require_parsed); role: keep each "
                "call's row by its own credit (a writer or proposer row whose queries found new gold, a consolidator "
                "row whose stop-or-continue was right, an answer row with F1 >= min_answer_f1)."})
    min_answer_f1: float = field(default=1.0, metadata={
        "help": "With filter role: the answer rows kept, by F1 in [0, 1] (1.0 keeps exact answers only)."})
    min_rows_per_role: int = field(default=0, metadata={
        "help": "A role whose kept rows are fewer than this keeps none (a handful of rows teaches a constant); its "
                "role is then served by the base model. 0: no floor.", "check": check_count})
    require_correct: bool = field(default=True, metadata={"help": "filter trace: keep only samples answered right."})
    require_parsed: bool = field(default=True, metadata={"help": "Keep only calls whose output parsed."})
    max_prompt_tokens: int | None = field(default=None, metadata={
        "help": "Drop rows with longer prompts, counted with `tokenizer`; null: no cap."})
    max_completion_tokens: int | None = field(default=None, metadata={
        "help": "Drop rows with longer completions, counted with `tokenizer`; null: no cap."})
    dedupe: bool = field(default=True, metadata={
        "help": "Drop a role call whose (role, prompt, completion) an earlier kept sample already gave."})
    drop_question_echo: bool = field(default=False, metadata={
        "help": "Drop a writer row whose sub-query is the question itself (equal after FlashRAG's answer "
                "normalisation; counted as question_echo): the question's own search is agent.search_question's, so "
                "such a row teaches the writer to spend a direction on what that search finds."})
    max_samples_per_question: int | None = field(default=2, metadata={
        "help": "Kept samples (traces) per question, in sample order; null: all."})
    skip_bad_lines: bool = field(default=False, metadata={"help": "Skip unreadable trace lines instead of stopping."})
    enable_thinking: bool = field(default=False, metadata={"help": "Keep the teacher's reasoning in the rows."})
    tokenizer: str | None = field(default=None, metadata={
        "help": "For token statistics and caps; null: train.student's."})
    eval_fraction: float = field(default=0.0, metadata={
        "help": "Held out for the eval loss during training, in [0, 1): this fraction of the kept questions (seeded), "
                "every row of a held-out question in <adapter>/eval.jsonl."})
    eval_seed: int = field(default=0, metadata={"help": "Seed of the held-out questions' shuffle."})
    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.min_answer_f1 <= 1.0:
            raise ValueError(f"min_answer_f1 must be in [0, 1], got {self.min_answer_f1}")


@dataclass
class TrainConfig:
    """`maps-train train`: one LoRA adapter per adapter of sft_data.adapter_roles on the student."""

    student: str = field(default="builtin:smollm2-135m-instruct", metadata={
        "help": "The student base model (a builtin: name, a hub id or a folder)."})
    sft_dir: str | None = field(default=None, metadata={
        "help": "The SFT sets read; null: where `sft-data` writes them for this recipe."})
    output_dir: str = field(default="runs/adapters", metadata={
        "help": "The adapters (<output_dir>/<adapter>/) and the trainer's checkpoints (_trainer/)."})
    shared_adapter: bool = field(default=False, metadata={"help": "One adapter for all roles instead of one per role."})
    dtype: str = field(default="auto", metadata={
        "help": "The student's weights at load time; auto: bfloat16 with sft.bf16 on GPU, else float32."})
    attn_implementation: str | None = field(default=None, metadata={
        "help": "transformers' attention, e.g. flash_attention_2 on GPU (packing then runs padding-free); null: its "
                "default."})
    accelerate_config: str | None = field(default=None, metadata={
        "help": "The accelerate config `maps-train train` launches with; null: see num_processes."})
    num_processes: int = field(default=1, metadata={
        "help": "Without accelerate_config: ranks to start (CPU: gloo)."})
    one_launch: bool = field(default=False, metadata={
        "help": "`--role all` in one `accelerate launch` (adapters one after another in the same ranks) instead of "
                "one launch per adapter: saves a launch, its imports and a model load per adapter."})
    sft: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Keyword arguments of trl.SFTConfig over maps-train's departures (library_options.SFT_DEFAULTS); "
                "checked against TRL's fields by the train stage.", "check": check_sft_options})
    lora: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Keyword arguments of peft.LoraConfig over maps-train's departures (library_options.LORA_DEFAULTS); "
                "checked by PEFT in the train stage.", "check": check_lora_options})

    def __post_init__(self) -> None:
        self.sft = {**SFT_DEFAULTS, **self.sft}
        self.lora = {**LORA_DEFAULTS, **self.lora}

    @staticmethod
    def unknown_key_hint(key: str) -> str | None:
        """Where a key written directly under `train` belongs: the flat layout before `sft`/`lora` (`lora_r`,
        `sft_kwargs`, `learning_rate`, ...) is a one-line pointer to the new key, not only "unknown"."""
        if key in RENAMED_TRAIN_KEYS:
            return RENAMED_TRAIN_KEYS[key]
        from peft import LoraConfig
        from trl import SFTConfig

        for section, cls in (("sft", SFTConfig), ("lora", LoraConfig)):
            if key in {f.name for f in fields(cls)}:
                return f"{section}.{key}"
        return None


RENAMED_TRAIN_KEYS = {"lora_r": "lora.r", "sft_kwargs": "sft"}  # the rest are SFTConfig or LoraConfig fields


@dataclass
class ServeConfig:
    """`maps-train serve`: the student with its adapters behind `vllm serve`."""

    base_model: str | None = field(default=None, metadata={"help": "The student base model; null: train.student."})
    adapters_dir: str | None = field(default=None, metadata={"help": "The adapters served; null: train.output_dir."})
    host: str = field(default="127.0.0.1", metadata={"help": "The server's address."})
    port: int = field(default=8000, metadata={"help": "The server's port."})
    extra_args: list[str] = field(default_factory=list, metadata={"help": "More `vllm serve` arguments, as written."})
    startup_timeout_s: float = field(default=600.0, metadata={"help": "How long the server may take to answer /health."})
    tensor_parallel_size: int = field(default=1, metadata={
        "help": "The student's own tensor parallelism (its server, and its offline engine in eval and on-policy "
                "runs); the teacher's is backend.tensor_parallel_size.", "check": check_positive})
    gpu_memory_utilization: float | None = field(default=None, metadata={
        "help": "The server's share of each GPU it runs on, in (0, 1]; null: backend.gpu_memory_utilization.",
        "check": check_fraction})


@dataclass
class OnPolicyConfig:
    """`maps-train distill-on-policy`: the student runs MAPS, the teacher (this recipe's roles) labels its calls."""

    iterations: int = field(default=1, metadata={"help": "Rounds of student run, teacher labels, SFT."})
    out_dir: str = field(default="runs/onpolicy", metadata={
        "help": "iter-<i>/{student, labels.jsonl, sft, adapters, stats.json} per round."})
    questions: list[str] = field(default_factory=list, metadata={
        "help": "Training question files; empty: traces.questions."})
    limit: int | None = field(default=None, metadata={"help": "First N questions of each file; null: all."})
    label: Literal["all", "failed"] = field(default="all", metadata={
        "help": "Which student calls go to the teacher: all, or failed (only calls whose output did not parse)."})
    keep: Literal["all", "divergent"] = field(default="all", metadata={
        "help": "Which labels train: all that parse (and, for the answer role, are right), or divergent (only where "
                "the student failed or wrote something else than the teacher)."})
    mix_ratio: float = field(default=1.0, metadata={
        "help": "Off-policy (teacher-trace) rows per on-policy row in each round's SFT set."})
    batch_size: int = field(default=256, metadata={"help": "Teacher calls per backend call."})
    seed: int = field(default=0, metadata={"help": "Seed of the round's sampling and mixing."})


@dataclass
class RLRewardConfig:
    """The reward of one rollout (one question answered by the student): each part is logged on its own, the
    total is their weighted sum. TRL's advantages are taken unscaled (`rl.grpo.scale_rewards: none`), so every
    weight keeps its meaning: an advantage is a difference of rewards in these units."""

    correctness: Literal["cover_em", "em", "f1"] = field(default="em", metadata={
        "help": "The answer's score: em (as Search-R1 and ParallelSearch train), cover_em (the gold on word "
                "boundaries, 0 for an answer that names more than one candidate) or f1."})
    length_guard_words: int | None = field(default=12, metadata={
        "help": "With cover_em an answer of more words than this scores 0 (the gold inside a paragraph would "
                "otherwise count); null: no guard.", "check": check_positive_or_null})
    correctness_weight: float = field(default=1.0, metadata={
        "help": "Weight of the correctness part (>= 0).", "check": check_weight})
    format_weight: float = field(default=0.1, metadata={
        "help": "Weight of the branch call's output parsing against its role's schema (>= 0).", "check": check_weight})
    cost_weight: float = field(default=0.0, metadata={
        "help": "lambda: the cost part is -lambda x cost / cost_scale (>= 0).", "check": check_weight})
    cost_unit: Literal["tokens", "rounds", "retrievals"] = field(default="rounds", metadata={
        "help": "What the cost part counts."})
    cost_scale: float = field(default=1.0, metadata={
        "help": "The cost's unit size, e.g. 1000 with tokens: lambda per thousand tokens (> 0).",
        "check": check_finite_positive})
    charge_cost: Literal["right", "all"] = field(default="right", metadata={
        "help": "right: only a right branch pays its cost (a wrong one cannot win by being cheap); all: every "
                "branch pays."})
    evidence_weight: float = field(default=0.0, metadata={
        "help": "Shaping by evidence recall where the question has gold passages, 0 elsewhere (>= 0).",
        "check": check_weight})
    process_weight: float = field(default=0.5, metadata={
        "help": "Weight of the branch call's own credit: a writer's or proposer's share of the gold its queries found "
                "new, a consolidator's right stop-or-continue, the answer call's F1; 0 without gold passages (>= 0).",
        "check": check_weight})
    process_depth: int | None = field(default=None, metadata={
        "help": "A writer's or proposer's process reward graded by rank: its sub-queries searched again this deep, "
                "each gold passage no earlier search found paid 1 / log2(1 + its best rank); null: the share of the "
                "gold found new in the agent's own top k.", "check": check_positive_or_null})

    def __post_init__(self) -> None:
        """Built in code (not from a recipe, whose loader runs the same checks naming the file): checked alike."""
        try:
            check_fields(self)
        except FieldError as err:
            raise ConfigError(f"rl.reward.{err.key}: {err.message}") from None


def check_role_reward(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`rl.role_reward`: per role, `rl.reward` fields checked as `rl.reward` checks them (types, then each field's
    own check), so a wrong one names rl.role_reward.<role>.<field> in one line at load."""
    plain_name_keys(value)
    checked = {}
    for role, override in value.items():  # each a dict: the loader checked the annotation
        try:
            checked[role] = check_dataclass_kwargs(RLRewardConfig, override, "rl.reward")
            check_fields(RLRewardConfig, checked[role])
        except FieldError as err:
            raise FieldError(f"{role}.{err.key}", err.message) from None
    return checked


@dataclass
class RLConfig:
    """`maps-train rl`: GRPO (TRL's GRPOTrainer) on role adapters, with MAPS as the environment."""

    roles: list[str] = field(default_factory=lambda: ["consolidator"], metadata={
        "help": "Trained roles, one adapter each, in turn."})
    init: Literal["distilled", "base"] = field(default="distilled", metadata={
        "help": "distilled: start from the SFT adapters; base: a fresh LoRA (train.lora)."})
    adapters_dir: str | None = field(default=None, metadata={
        "help": "The distilled adapters; null: train.output_dir."})
    questions: list[str] = field(default_factory=list, metadata={
        "help": "Training question files; empty: traces.questions."})
    limit: int | None = field(default=None, metadata={"help": "First N questions of each file; null: all."})
    output_dir: str = field(default="runs/rl", metadata={
        "help": "adapters/<adapter>/ (the RL adapters) and _trainer/<role>/ (checkpoints)."})
    num_generations: int = field(default=4, metadata={"help": "G rollouts per question.", "check": check_positive})
    temperature: float = field(default=1.0, metadata={
        "help": "The rollouts' sampling temperature (> 0).", "check": check_finite_positive})
    max_completion_tokens: int = field(default=256, metadata={
        "help": "Most tokens of a trained call (GRPOConfig.max_completion_length).", "check": check_positive})
    environment: Literal["distilled", "server", "recipe"] = field(default="distilled", metadata={
        "help": "Who answers the calls RL does not train: distilled (the student with its distilled adapters on an "
                "in-process vLLM engine), server (the same adapters served by `maps-train serve`), or recipe (the "
                "recipe's roles as written: for a student recipe, its teacher)."})
    rollout: Literal["hf", "vllm"] = field(default="hf", metadata={
        "help": "Who generates the trained roles' tokens: the trainer's own model (transformers) or TRL's vLLM "
                "engine, its weights synced each step (rl.grpo.vllm_mode: colocate or server)."})
    decoding: Literal["deployed", "free"] = field(default="deployed", metadata={
        "help": "deployed: the branch call sampled at rl.temperature under its role's schema where the deployed "
                "route enforces one, every other call decoded as deployed; free: every call sampled at "
                "rl.temperature without a schema."})
    decisions: Literal["sampled", "both"] = field(default="sampled", metadata={
        "help": "At a branch on a yes/no decision (the consolidator's stop-or-continue): sampled draws it with the "
                "rest of the call; both fixes stop in the even branches and go on in the odd ones, so every such "
                "group compares the two decisions."})
    seed: int = field(default=0, metadata={"help": "Seed of the question order and the rollouts."})
    reward: RLRewardConfig = field(default_factory=RLRewardConfig, metadata={
        "help": "The reward of one rollout, a weighted sum of logged parts."})
    role_reward: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={
        "help": "Per trained role, the rl.reward fields that differ for it, e.g. {consolidator: {cost_weight: 0.2}}.",
        "check": check_role_reward})
    grpo: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Keyword arguments of trl.GRPOConfig over maps-train's departures (library_options.GRPO_DEFAULTS); "
                "checked against TRL's fields by the rl stage.", "check": check_grpo_options})

    def __post_init__(self) -> None:
        self.grpo = {**GRPO_DEFAULTS, **self.grpo}

    def reward_for(self, role: str) -> RLRewardConfig:
        """The reward `role` trains under: rl.reward with rl.role_reward.<role>'s fields replaced."""
        return replace(self.reward, **self.role_reward.get(role, {}))


@dataclass
class HardwareConfig:
    """The machine a recipe was sized for; `maps-train plan` checks every stage against it by default."""

    gpus: int = field(default=0, metadata={
        "help": "GPUs; 0: CPUs only (vLLM-CPU, gloo training), memory_gb is then the budget of every stage.",
        "check": check_count})
    gpu_memory_gb: float = field(default=80.0, metadata={
        "help": "Memory per GPU, in 10^9 bytes.", "check": check_gigabytes})
    memory_gb: float = field(default=16.0, metadata={"help": "Host memory, in 10^9 bytes.", "check": check_gigabytes})
    faiss_gpu: bool = field(default=False, metadata={
        "help": "The FAISS there is a GPU build (the index is then split over the GPUs); the GPU set ships faiss-cpu, "
                "so by default the index stays in host memory."})


@dataclass
class Recipe:
    """One experiment: a section per pipeline stage (see SECTION_STAGES in maps_train.config.explain)."""

    name: str = field(default="default", metadata={
        "help": "The experiment's name, in run and artifact names (a plain name).", "check": plain_name_field})
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig, metadata={
        "help": "The passage index and how it is searched."})
    backend: BackendConfig = field(default_factory=BackendConfig, metadata={
        "help": "Engine and client settings shared by every route."})
    roles: dict[str, RoleRoute] = field(default_factory=lambda: {"default": RoleRoute()}, metadata={
        "help": "Role -> route (model, adapter, sampling); roles not listed use 'default'.",
        "check": plain_name_keys})
    agent: AgentConfig = field(default_factory=AgentConfig, metadata={"help": "The agent's method and budgets."})
    traces: TracesConfig = field(default_factory=TracesConfig, metadata={"help": "The teacher's trace runs."})
    sft_data: SFTDataConfig = field(default_factory=SFTDataConfig, metadata={
        "help": "Which trace calls become SFT rows for which adapter."})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "LoRA SFT of the student."})
    serve: ServeConfig = field(default_factory=ServeConfig, metadata={"help": "Serving the student's adapters."})
    onpolicy: OnPolicyConfig = field(default_factory=OnPolicyConfig, metadata={
        "help": "On-policy distillation: the teacher labels the student's calls."})
    rl: RLConfig = field(default_factory=RLConfig, metadata={"help": "GRPO on role adapters."})
    wandb: WandbConfig = field(default_factory=WandbConfig, metadata={"help": "Weights & Biases tracking."})
    hardware: HardwareConfig = field(default_factory=HardwareConfig, metadata={
        "help": "The machine the recipe was sized for (maps-train plan)."})

    def route(self, role: str) -> RoleRoute:
        return route_for(self.roles, role)


SHARED_ADAPTER = "shared"  # the one adapter of every role when train.shared_adapter is set


def adapter_names(recipe: Recipe) -> list[str]:
    """The adapters a recipe trains and serves: one per `sft_data.adapter_roles` key, or the single shared one."""
    return [SHARED_ADAPTER] if recipe.train.shared_adapter else list(recipe.sft_data.adapter_roles)


def adapter_of_role(recipe: Recipe, shared: bool | None = None) -> dict[str, str]:
    """Role -> adapter. `shared` (default: `train.shared_adapter`) sends every role to the shared adapter;
    False gives the per-role SFT sets that `sft-data` writes whatever is trained from them."""
    shared = recipe.train.shared_adapter if shared is None else shared
    mapping = {role: adapter for adapter, roles in recipe.sft_data.adapter_roles.items() for role in roles}
    return {role: SHARED_ADAPTER for role in sorted(mapping)} if shared else mapping


def route_for(routes: dict[str, RoleRoute], role: str) -> RoleRoute:
    """The route of `role`: its own, else the "default" route; a one-line error naming the routed roles."""
    if role in routes:
        return routes[role]
    if "default" in routes:
        return routes["default"]
    from maps_train.errors import ConfigError

    raise ConfigError(
        f"roles.{role}: no route for role '{role}' and no 'default' route "
        f"(routed roles: {', '.join(sorted(routes)) or 'none'})"
    )


def sft_traces_dir(recipe: Recipe) -> Path:
    """The traces `sft-data` reads: sft_data.traces_dir, else the recipe's (its teacher's) traces.out_dir."""
    return Path(recipe.sft_data.traces_dir or recipe.traces.out_dir)


# The sft_data settings that decide which rows an SFT set holds (skip_bad_lines only decides whether to stop).
SFT_ROW_SETTINGS = ("adapter_roles", "require_correct", "require_parsed", "max_prompt_tokens", "max_completion_tokens",
                    "dedupe", "max_samples_per_question", "enable_thinking", "eval_fraction", "eval_seed")


def sft_set_settings(recipe: Recipe) -> dict[str, Any]:
    """What an SFT set's rows depend on besides the traces. Rows are template-independent message lists (each
    student's chat template renders them at training time), so the tokenizer enters only through the length caps
    (the token caps, `train.sft.max_length`), and then as its identity (template, vocabulary), not its name: Qwen3
    sizes still share one set."""
    config = recipe.sft_data
    settings: dict[str, Any] = {name: getattr(config, name) for name in SFT_ROW_SETTINGS}
    if config.filter != "trace":  # only then: the sets of recipes written before the role filter keep their folder
        settings.update(filter=config.filter, min_answer_f1=config.min_answer_f1)
    if config.min_rows_per_role:  # only then: sets written before the floor keep their folder
        settings["min_rows_per_role"] = config.min_rows_per_role
    if config.drop_question_echo:  # only then: sets written before the option keep their folder
        settings["drop_question_echo"] = True
    # sft-data drops rows longer than train.sft.max_length (TRL would cut their completion), counted with the
    # student's template: then both decide the rows. Students with one tokenizer and max_length share a set.
    max_length = recipe.train.sft.get("max_length")
    if max_length is not None:
        settings["max_length"] = max_length
    if max_length is not None or config.max_prompt_tokens is not None or config.max_completion_tokens is not None:
        settings["tokenizer"] = tokenizer_identity(config.tokenizer or recipe.train.student)
    return settings


def sft_set_dir(recipe: Recipe) -> Path:
    """Where `sft-data` writes: sft_data.out_dir, else <traces>/sft/<hash of sft_set_settings>."""
    if recipe.sft_data.out_dir:
        return Path(recipe.sft_data.out_dir)
    text = json.dumps(sft_set_settings(recipe), sort_keys=True)
    return sft_traces_dir(recipe) / "sft" / hashlib.sha256(text.encode()).hexdigest()[:12]


def train_sft_dir(recipe: Recipe) -> Path:
    """The SFT sets `train` reads: train.sft_dir, else where `sft-data` wrote them for this recipe."""
    return Path(recipe.train.sft_dir) if recipe.train.sft_dir else sft_set_dir(recipe)


@functools.lru_cache(maxsize=8)
def tokenizer_identity(name: str) -> str:
    """A short hash of what makes two tokenizers count and render alike: class, vocabulary size, chat template."""
    from transformers import AutoTokenizer

    from maps_train.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name))
    text = json.dumps([type(tokenizer).__name__, len(tokenizer), tokenizer.chat_template or ""], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_recipe(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    from maps_train.config.overlays import load_config

    return load_config(Recipe, path, overrides)
