"""The recipe: one YAML file per experiment, one dataclass section per pipeline stage.

Every command reads the sections it needs from the same recipe, so a teacher run, its SFT sets, the student's
training and its serving are described in one place. A student recipe is an overlay on its teacher's
(`base: ../teacher/qwen3-32b.yaml`, see `maps_train.config.overlays`): it inherits the routes, retrieval and traces, so
every student reads the one teacher run. Field names are the YAML keys; see `recipes/` for examples and
`maps-train config show RECIPE` for the resolved (merged) values.

`train.sft`, `train.lora` and `rl.grpo` are the keyword arguments of TRL's `SFTConfig`, PEFT's `LoraConfig` and
TRL's `GRPOConfig` as those libraries define them, checked against the libraries' own fields when the recipe loads;
a section holds what the recipe sets over maps-train's few departures (`maps_train.library_options`), and every
other option is the library's default.

Every name that becomes a folder or run name (the recipe's `name`, route and trace role names, adapter names, the
questions files whose names become trace folders) is checked when the recipe loads: one line naming the file and
the field, before any stage writes (or `train --overwrite` removes) anything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

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
    corpus: str = "data/demo/corpus.jsonl"
    kind: Literal["dense", "bm25"] = "dense"
    encoder: str = "builtin:minilm-l6"
    index_dir: str | None = None  # from `maps-train index build`; null: $MAPS_TRAIN_HOME/indexes/<corpus>-<checksum>/
    index_type: Literal["flat", "hnsw", "ivfpq"] = "flat"
    top_k: int = 5
    service_url: str | None = None  # a running `maps-train retrieve serve`; in-process search when null
    encode_batch_size: int = 64
    chunk_size: int = 4096  # passages per resumable embedding chunk
    fp16: bool = True  # on GPU only
    hnsw_m: int = 32
    ivf_nlist: int = 4096
    pq_m: int = 64
    nprobe: int = 64
    query_prefix: str | None = None  # null: the encoder registry's (E5 "query: ", BGE's instruction, MiniLM none)
    passage_prefix: str | None = None  # null: the encoder registry's (E5 "passage: ")
    embedding_dtype: Literal["float16", "float32"] = "float16"  # the memory-mapped embedding matrix on disk
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    auto_build: bool = True  # build_retriever builds a missing index (with a log line) instead of failing
    service_timeout_s: float = 60.0  # RetrievalClient request timeout
    service_max_batch: int = 256  # `retrieve serve`: most queries merged into one search call
    service_max_wait_ms: float = 5.0  # `retrieve serve`: how long the first request waits for others to join
    # A flat index searched in host memory: fp32 (FAISS's BLAS search, several times faster) where it takes at most
    # half the host's memory, else fp16 (half the memory); or either, forced (retrieval/faiss_index.py).
    flat_precision: Literal["auto", "fp32", "fp16"] = "auto"
    # FAISS's CPU search threads in this process (accelerate sets OMP_NUM_THREADS=1 in each rank): null: the CPUs
    # shared out over the ranks on this machine (LOCAL_WORLD_SIZE).
    search_threads: int | None = None


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

    backend: Literal["vllm", "openai", "hf"] = "vllm"
    model: str = "builtin:smollm2-135m-instruct"
    adapter: str | None = None  # a LoRA adapter folder (vllm, hf) or the served adapter name (openai)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None  # null or 0: no top-k
    min_p: float | None = None
    presence_penalty: float | None = None  # on tokens already generated, as vLLM and the OpenAI API define it
    repetition_penalty: float | None = None
    max_tokens: int = 256
    enable_thinking: bool = False  # Qwen3 chat-template switch
    structured: bool = True  # constrain the output with the role's JSON schema where the backend can
    seed: int | None = None


def check_positive(value: int) -> int:
    if value < 1:
        raise FieldError("", f"must be at least 1, got {value}")
    return value


def check_fraction(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 1:
        raise FieldError("", f"must be a fraction of the GPU in (0, 1], got {value}")
    return value


def check_count(value: int) -> int:
    """A number of things (GPUs): 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FieldError("", f"must be an integer >= 0, got {value!r}")
    return value


def check_gigabytes(value: float) -> float:
    """An amount of memory: finite and above 0 (NaN, infinity and negative sizes are not sizes)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise FieldError("", f"must be a finite number of gigabytes > 0, got {value!r}")
    return value


def check_weight(value: float) -> float:
    """A reward part's weight: finite and 0 or more (a negative weight would reward what it means to cost)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise FieldError("", f"must be a finite number >= 0, got {value!r}")
    return value


def check_finite_positive(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise FieldError("", f"must be a finite number > 0, got {value!r}")
    return value


def check_positive_or_null(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or value < 1):
        raise FieldError("", f"must be >= 1 or null, got {value!r}")
    return value


@dataclass
class BackendConfig:
    """Engine and client settings shared by every route."""

    dtype: str = "auto"  # on vLLM-CPU: bfloat16 where the CPU multiplies bf16, else float32 (platform.vllm_dtype)
    max_model_len: int = 4096
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = False
    max_lora_rank: int = 16
    cpu_kv_cache_gib: int = 2
    base_urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000/v1"])  # openai backend
    # openai backend: keep it out of recipes; empty reads OPENAI_API_KEY from the environment (and a local `vllm serve`
    # without --api-key accepts anything). Recipes are logged to trackers: see maps_train.config.redact_secrets.
    api_key: str = ""
    concurrency: int = 32
    request_timeout_s: float = 120.0
    # openai backend: the SDK's own retries (timeouts, connection errors, 408/409/429, 5xx), with its own backoff
    # (0.5 s doubling to 8 s, jittered; a server's Retry-After honoured)
    max_retries: int = 4
    # openai backend: how long the first request to each server waits for its /health to answer (0: not at all), so
    # a run may start while its server is still starting (the demo starts both beside the index build)
    server_wait_s: float = 0.0
    # vLLM engine: JSON without free whitespace (engine-wide in vLLM, xgrammar); small models otherwise loop on blank lines.
    # For a server, pass `--structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'`.
    structured_disable_whitespace: bool = True
    # Prompts over the context: "shrink" what is least needed (oldest observations and turns, lowest-ranked
    # passages, the middle of long text; never the system prompt or the question), "error", or "left" (drop the
    # oldest tokens: the system prompt and the question go first).
    truncate_prompt: Literal["shrink", "error", "left"] = "shrink"
    # A call whose reasoning hits its max_tokens inside `<think>` (maps_train/llm/budget.py): "answer" closes the
    # reasoning with Qwen3's stop-thinking sentence and asks for the answer with `reasoning_cap_answer_tokens` more
    # (both calls' tokens on the question's cost); "none" keeps the empty answer. Either way the call is counted.
    reasoning_cap: Literal["answer", "none"] = "answer"
    reasoning_cap_answer_tokens: int = field(default=512, metadata={"check": check_positive})
    # vLLM, a multimodal model run on text only (Qwen3.6): skip its vision encoder, whose memory goes to the KV
    # cache instead (`vllm.LLM(language_model_only=True)`, `vllm serve --language-model-only`).
    language_model_only: bool = False
    # vLLM in process: "loop" steps a `vllm.LLM` from one thread; "async" runs vLLM's `AsyncLLM` (the engine of
    # `vllm serve`) on its own event loop. Same tokens; no speed difference measured (docs/throughput.md).
    vllm_engine: Literal["loop", "async"] = "loop"
    hf_batch_size: int = 16


@dataclass
class SamplingConfig:
    """What the agent puts on every request it sends, over its routes' sampling (null: the route's value)."""

    temperature: float | None = None
    top_p: float | None = None
    # Base seed. Each request's seed is derived from (seed, sample, question id, role, call index of that role in
    # the question), so a run is reproducible whatever the batch size or a resume; null: no seed is sent.
    seed: int | None = None
    sample: int = 0  # which sample of a question this run is (`maps-train traces` sets it per sample folder)


@dataclass
class AgentConfig:
    method: Literal["maps", "vanilla", "search_o1", "parallel_search", "s3"] = "maps"
    num_directions: int = 3  # N; the no-parallelism ablation is N = 1
    max_rounds: int = 10
    # MAPS: the rounds searched before the consolidator's stop is obeyed (1: from the first). A stop before it is
    # recorded as the consolidator said it (the credit judges that decision) and the search goes on: a floor on
    # the search for a budget that can afford it, and the measure of what a later round buys (docs/learning-study.md).
    min_rounds: int = 1
    top_k: int = 5
    use_directions: bool = True  # ablation "no directions": the writer writes N sub-queries directly
    decoupled: bool = True  # ablation "no decoupling": every role also sees the full trajectory
    answer_mode: Literal["auto", "short", "choice"] = "auto"  # auto: choice when a question has options
    batch_size: int = 64  # questions advanced together (schedule: step)
    # How questions advance (maps_train/agents/schedule.py): step = batches of `batch_size` in lockstep;
    # continuous = up to `concurrency` questions each on its own, calls batched by the engine as they come;
    # auto = continuous when every engine takes concurrent calls (vLLM, openai), else step.
    schedule: Literal["auto", "continuous", "step"] = "auto"
    concurrency: int | None = None  # questions in flight at once (continuous); null: batch_size
    max_passage_words: int = 120
    max_searches: int = 10  # search_o1 / parallel_search / s3
    max_turns: int = 15
    prompts_dir: str | None = None  # overrides the packaged prompt files
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # per-request sampling over the routes'
    # Privileged hints, for teacher traces only (`traces.hint` sets it; evaluation refuses it): "gold_titles" adds
    # to each writer call's direction the titles of the question's gold passages that its prompt already names
    # and no search of the question has found yet. sft-data trains on the prompt without the hint.
    hint: Literal["none", "gold_titles"] = "none"
    # MAPS: round 1 also searches the question itself, before the sub-queries (Vanilla RAG's one search, no model
    # call). Off: the paper's MAPS, sub-queries only. Measured (docs/learning-study.md): the 135M distilled agent's
    # recall equals Vanilla RAG's wherever a sub-query echoes the question and trails it elsewhere. With it on, the
    # credit of the round's writer and proposer calls counts only the gold the question's search missed.
    search_question: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_rounds <= self.max_rounds:
            raise ValueError(f"min_rounds must be from 1 to max_rounds ({self.max_rounds}), got {self.min_rounds}")


def check_questions_files(paths: list[str]) -> list[str]:
    """Each entry names a file: its name becomes a folder under traces.out_dir (`.`, `..` or `dir/` would not)."""
    for index, path in enumerate(paths):
        if Path(path).name in ("", ".", ".."):
            raise FieldError(f"[{index}]", f"{path!r} does not name a questions file")
    return paths


@dataclass
class TracesConfig:
    questions: list[str] = field(default_factory=lambda: ["data/demo/train.jsonl"],
                                 metadata={"check": check_questions_files})
    out_dir: str = "runs/traces"
    # > 1: rejection sampling. Every request of sample k carries sample_temperature, top_p and a seed derived
    # from (seed, k, question, role, call index) (see agent.sampling); sft-data keeps the correct, distinct ones.
    samples_per_question: int = 1
    sample_temperature: float = 0.7  # used when samples_per_question > 1
    top_p: float | None = None  # used when samples_per_question > 1; null: each route's top_p
    limit: int | None = None
    seed: int = 0  # base seed of the sampled runs
    # Rationalization (STaR): "gold_titles" shows the teacher's writer the gold passages' titles its prompt already
    # names (agent.hint); the rows train on the prompt without them, so the student learns to name those entities
    # unaided. Only the traces are hinted, never an evaluation.
    hint: Literal["none", "gold_titles"] = "none"


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
    traces_dir: str | None = None  # null: traces.out_dir (the teacher's traces, shared by every student)
    # null: <traces_dir>/sft/<key>, the key a hash of what decides the rows (`sft_set_settings`), so students whose
    # rows would be the same share one set. Rows are message lists, rendered by each student's template at training.
    out_dir: str | None = None
    # adapter -> the trace roles whose calls train it (plain names: adapters become folders)
    adapter_roles: dict[str, list[str]] = field(
        default_factory=lambda: {
            "proposer": ["proposer"],
            "writer": ["writer"],
            "consolidator": ["consolidator", "answer"],
        },
        metadata={"check": check_adapter_roles},
    )
    # "trace": keep or drop a whole sample by its outcome (require_correct, require_parsed); "role": keep each call's
    # row by its own credit (`records.credit`: a writer or proposer row whose queries found new gold, a consolidator
    # row whose stop-or-continue was right, an answer row with F1 >= min_answer_f1), its own parse for require_parsed.
    filter: Literal["trace", "role"] = "trace"
    min_answer_f1: float = 1.0  # with filter "role": 1.0 keeps exact answers only
    # A role whose kept rows are fewer than this keeps none: a handful of rows teaches a constant (the learning
    # study's 4 answer rows, mostly "yes", made the distilled agent answer "yes" to 107 of 152 dev questions). Its
    # adapter is then trained without it, records so (`rows_per_role` in its `train_summary.json`), and the
    # distilled routes send that role to the base model; an adapter with no row left is not trained at all
    # (maps_train/train/unlearned.py). 0: no floor.
    min_rows_per_role: int = field(default=0, metadata={"check": check_count})
    require_correct: bool = True
    require_parsed: bool = True
    max_prompt_tokens: int | None = None  # token caps count with `tokenizer`: only then does the template matter
    max_completion_tokens: int | None = None
    dedupe: bool = True  # drop a role call whose (role, prompt, completion) an earlier kept sample already gave
    max_samples_per_question: int | None = 2  # kept samples (traces) per question, in sample order; null: all
    skip_bad_lines: bool = False
    enable_thinking: bool = False
    tokenizer: str | None = None  # for token statistics and caps; the student when null
    # Held out for the eval loss during training: this fraction of the kept questions (seeded shuffle), every row of
    # a held-out question in <adapter>/eval.jsonl, so no question is in both splits (nor in another role's train).
    eval_fraction: float = 0.0
    eval_seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.min_answer_f1 <= 1.0:
            raise ValueError(f"min_answer_f1 must be in [0, 1], got {self.min_answer_f1}")


@dataclass
class TrainConfig:
    student: str = "builtin:smollm2-135m-instruct"
    sft_dir: str | None = None  # null: where `sft-data` writes (sft_data.out_dir, or its default under the traces)
    output_dir: str = "runs/adapters"
    shared_adapter: bool = False  # one adapter for all roles instead of one per role
    dtype: str = "auto"  # the student's weights at load time; auto: bfloat16 with sft.bf16 on GPU, else float32
    attn_implementation: str | None = None  # e.g. flash_attention_2 on GPU (packing runs padding-free)
    accelerate_config: str | None = None  # what `maps-train train` launches with; null: see --num-processes
    num_processes: int = 1  # `maps-train train` without accelerate_config: ranks to start (CPU: gloo)
    # `--role all` in ONE `accelerate launch` (adapters one after another in the same ranks) instead of one launch
    # per adapter: saves a launch, its imports and a model load per adapter (see docs/throughput.md, start-up costs);
    # one launch per adapter (the default) isolates them (fresh CUDA/DeepSpeed state for each).
    one_launch: bool = False
    # Keyword arguments of trl.SFTConfig and peft.LoraConfig, over SFT_DEFAULTS / LORA_DEFAULTS; checked against the
    # libraries' own fields when the recipe loads.
    sft: dict[str, Any] = field(default_factory=dict, metadata={"check": check_sft_options})
    lora: dict[str, Any] = field(default_factory=dict, metadata={"check": check_lora_options})

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
    base_model: str | None = None  # the student; train.student when null
    adapters_dir: str | None = None  # train.output_dir when null
    host: str = "127.0.0.1"
    port: int = 8000
    extra_args: list[str] = field(default_factory=list)
    startup_timeout_s: float = 600.0
    # The student's own tensor parallelism (its server, and its offline engine in eval and on-policy runs); the
    # teacher's is backend.tensor_parallel_size, which student overlays inherit. 1: students up to 8B fit one GPU.
    tensor_parallel_size: int = field(default=1, metadata={"check": check_positive})
    # The server's share of each GPU it runs on (`vllm serve --gpu-memory-utilization`); null: backend's, the
    # fraction `maps-train plan` budgets for it either way.
    gpu_memory_utilization: float | None = field(default=None, metadata={"check": check_fraction})


@dataclass
class OnPolicyConfig:
    """`maps-train distill-on-policy`: the student runs MAPS, the teacher (this recipe's roles) labels its calls."""

    iterations: int = 1
    out_dir: str = "runs/onpolicy"  # iter-<i>/{student, labels.jsonl, sft, adapters, stats.json}
    questions: list[str] = field(default_factory=list)  # training questions; traces.questions when empty
    limit: int | None = None  # first N questions of each file
    # which student calls go to the teacher: "all", or "failed" (only calls whose output did not parse: the
    # teacher's tokens go where the student is wrong)
    label: Literal["all", "failed"] = "all"
    # which labels train: "all" that parse (and, for the answer role, are right), or "divergent" (only where the
    # student failed or wrote something else than the teacher)
    keep: Literal["all", "divergent"] = "all"
    mix_ratio: float = 1.0  # off-policy (teacher-trace) rows per on-policy row in each iteration's SFT set
    batch_size: int = 256  # teacher calls per backend call
    seed: int = 0


@dataclass
class RLRewardConfig:
    """The reward of one rollout (one question answered by the student): each part is logged on its own, the
    total is their weighted sum. TRL's advantages are taken unscaled (`rl.grpo.scale_rewards: none`), so every
    weight keeps its meaning: an advantage is a difference of rewards in these units."""

    # EM by default, as Search-R1 and ParallelSearch train. Cover-EM here matches the gold on word boundaries and
    # scores 0 for an answer that hedges (names more than one candidate): "yes or no" is not right for "no".
    correctness: Literal["cover_em", "em", "f1"] = "em"
    # With Cover-EM an answer of more words than this scores 0: the gold inside a paragraph would otherwise count.
    # null: no guard (EM and F1 need none).
    length_guard_words: int | None = field(default=12, metadata={"check": check_positive_or_null})
    correctness_weight: float = field(default=1.0, metadata={"check": check_weight})
    # the branch call's own output parsed against its role's schema
    format_weight: float = field(default=0.1, metadata={"check": check_weight})
    # lambda: the cost term is -lambda x cost / cost_scale
    cost_weight: float = field(default=0.0, metadata={"check": check_weight})
    cost_unit: Literal["tokens", "rounds", "retrievals"] = "rounds"
    # e.g. 1000 with tokens: lambda per thousand tokens
    cost_scale: float = field(default=1.0, metadata={"check": check_finite_positive})
    # "right": only a right branch pays its cost (a wrong one cannot win by being cheap); "all": every branch pays
    charge_cost: Literal["right", "all"] = "right"
    # shaping by evidence recall where the question has gold passages (0 elsewhere)
    evidence_weight: float = field(default=0.0, metadata={"check": check_weight})
    # The branch call's own credit (records.credit): a writer's or proposer's share of the gold its queries found
    # new, a consolidator's right stop-or-continue, the answer call's F1; 0 for every branch of a question
    # without gold passages, so it moves no advantage there.
    process_weight: float = field(default=0.5, metadata={"check": check_weight})
    # A writer's or proposer's process reward graded by rank (records.credit.rank_credit): the branch call's
    # sub-queries searched again this deep, each gold passage no earlier search found paid 1 / log2(1 + its best
    # rank), so a query that brings missing gold closer earns something before it brings it into the top k.
    # null: the share of the gold found new in the agent's own top k (what the deployed agent reads).
    process_depth: int | None = field(default=None, metadata={"check": check_positive_or_null})

    def __post_init__(self) -> None:
        """Built in code (not from a recipe, whose loader runs the same checks naming the file): checked alike."""
        for item in fields(self):
            check = item.metadata.get("check")
            if check is not None:
                try:
                    check(getattr(self, item.name))
                except FieldError as err:
                    raise ConfigError(f"rl.reward.{item.name}: {err.message}") from None


def check_role_reward(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`rl.role_reward`: per role, `rl.reward` fields checked as `rl.reward` checks them (types, then each field's
    own check), so a wrong one names rl.role_reward.<role>.<field> in one line at load."""
    plain_name_keys(value)
    own_checks = {item.name: item.metadata.get("check") for item in fields(RLRewardConfig)}
    checked = {}
    for role, override in value.items():  # each a dict: the loader checked the annotation
        try:
            checked[role] = check_dataclass_kwargs(RLRewardConfig, override, "rl.reward")
            for name, item in checked[role].items():
                if own_checks[name] is not None:
                    try:
                        own_checks[name](item)
                    except FieldError as err:
                        raise FieldError(name, err.message) from None
        except FieldError as err:
            raise FieldError(f"{role}.{err.key}", err.message) from None
    return checked


@dataclass
class RLConfig:
    """`maps-train rl`: GRPO (TRL's GRPOTrainer) on role adapters, with MAPS as the environment."""

    roles: list[str] = field(default_factory=lambda: ["consolidator"])  # trained roles, one adapter each, in turn
    init: Literal["distilled", "base"] = "distilled"  # distilled: from the SFT adapters; base: a fresh LoRA
    adapters_dir: str | None = None  # the distilled adapters; null: train.output_dir
    questions: list[str] = field(default_factory=list)  # training questions; traces.questions when empty
    limit: int | None = None  # first N questions of each file
    output_dir: str = "runs/rl"  # adapters/<adapter>/ (the RL adapters), _trainer/<role>/ (checkpoints)
    num_generations: int = field(default=4, metadata={"check": check_positive})  # G rollouts per question
    temperature: float = field(default=1.0, metadata={"check": check_finite_positive})  # rollouts' sampling
    max_completion_tokens: int = field(default=256, metadata={"check": check_positive})
    # Who answers the calls RL does not train: "distilled" (the student with its distilled adapters from
    # adapters_dir, on an in-process vLLM engine, as eval's distilled system), "server" (the same adapters served by
    # `maps-train serve`, openai backend), or "recipe" (the recipe's roles: as written). A student recipe's roles are
    # its teacher's, so "recipe" makes the teacher the environment.
    environment: Literal["distilled", "server", "recipe"] = "distilled"
    rollout: Literal["hf", "vllm"] = "hf"  # who generates the trained roles' tokens: the trainer's own model
    # (transformers) or TRL's vLLM engine, its weights synced each step (rl.grpo.vllm_mode: colocate or server)
    # How the policy's calls are drawn. "deployed": the branch call sampled at rl.temperature under its role's
    # schema where the deployed route enforces one, every other call of the policy (the pilot's, a branch's later
    # ones) decoded as deployed (greedy, schema), so a branch's reward is its branch call's. "free": every call
    # sampled at rl.temperature without a schema (before this option existed).
    decoding: Literal["deployed", "free"] = "deployed"
    # At a branch on a yes/no decision (the consolidator's stop-or-continue): "sampled" draws it with the rest of
    # the call; "both" fixes it by the role's grammar, stop in the even branches and go on in the odd ones (the rest
    # of the call sampled as usual), so every such group compares the two decisions. A policy whose SFT rows were
    # all stops samples stop in every branch: a group with one decision has no spread, so no gradient.
    decisions: Literal["sampled", "both"] = "sampled"
    seed: int = 0
    reward: RLRewardConfig = field(default_factory=RLRewardConfig)
    # Per trained role, the rl.reward fields that differ for it: e.g. {consolidator: {cost_weight: 0.2,
    # charge_cost: all}} prices the consolidator's rounds and leaves the writer's reward as rl.reward says. Each
    # role's summary and checkpoints record the reward it trained under (`reward_for`).
    role_reward: dict[str, dict[str, Any]] = field(default_factory=dict, metadata={"check": check_role_reward})
    grpo: dict[str, Any] = field(default_factory=dict, metadata={"check": check_grpo_options})

    def __post_init__(self) -> None:
        self.grpo = {**GRPO_DEFAULTS, **self.grpo}

    def reward_for(self, role: str) -> RLRewardConfig:
        """The reward `role` trains under: rl.reward with rl.role_reward.<role>'s fields replaced."""
        return replace(self.reward, **self.role_reward.get(role, {}))


@dataclass
class HardwareConfig:
    """The machine a recipe was sized for; `maps-train plan` checks every stage against it by default."""

    # 0: CPUs only (vLLM-CPU, gloo training): memory_gb is then the budget of every stage
    gpus: int = field(default=0, metadata={"check": check_count})
    gpu_memory_gb: float = field(default=80.0, metadata={"check": check_gigabytes})  # per GPU, 10^9 bytes
    memory_gb: float = field(default=16.0, metadata={"check": check_gigabytes})  # host, 10^9 bytes
    # The FAISS there is a GPU build (the index is then split over the GPUs); the GPU set ships faiss-cpu, as PyPI has
    # no FAISS GPU wheel for vLLM's CUDA (docs/install-gpu.md), so by default the index stays in host memory.
    faiss_gpu: bool = False


@dataclass
class Recipe:
    name: str = field(default="default", metadata={"check": plain_name_field})  # in run and artifact names
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    # role -> route; roles not listed use "default"
    roles: dict[str, RoleRoute] = field(default_factory=lambda: {"default": RoleRoute()},
                                        metadata={"check": plain_name_keys})
    agent: AgentConfig = field(default_factory=AgentConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)
    sft_data: SFTDataConfig = field(default_factory=SFTDataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    onpolicy: OnPolicyConfig = field(default_factory=OnPolicyConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)

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
