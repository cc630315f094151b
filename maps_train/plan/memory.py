"""Bytes per device for each kind of process, from a model's shape and a recipe's settings.

Every figure is an estimate of the peak a process reaches, in bytes (GB below means 10^9 bytes, so an "80 GB"
GPU is taken as 80e9 bytes, a little under what one reports: the plan errs towards refusing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from maps_train.plan.shapes import ModelShape

GB = 1e9
BF16, FP32 = 2, 4
# CUDA context, NCCL buffers and allocator slack of one training rank.
TRAIN_RUNTIME_BYTES = 2 * GB
# A vLLM engine's own use besides weights and KV cache, per GPU: CUDA context, CUDA graphs and the activation peak of
# its profile run. vLLM measures the real figure when it starts; 3 GB covers the models shipped here at their
# default max_num_batched_tokens.
VLLM_RUNTIME_BYTES = 3 * GB
# TRL's fused LM head (trl/kernels/chunked_logprob.py and trl/trainer/utils.py, TRL 1.16) projects through cuBLAS
# tiles of TOKEN_CHUNK_SIZE positions x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries, one tile buffer at a time.
FUSED_HEAD_TILE_TOKENS = 4096
FUSED_HEAD_TILE_VOCAB = 32768
# fp32 values it keeps per scored position: 7 online-softmax statistics, the log-prob, entropy and is_top1 outputs
# and their zero-filled scatter back to every position, and the log-prob's gradient.
FUSED_HEAD_STATS = 12
# faiss.StandardGpuResources reserves this much temporary memory on each GPU an index is cloned to (1.5 GiB).
FAISS_TEMP_BYTES = 1536 * 2**20


def layer_activation_bytes(shape: ModelShape, lora_rank: int, lora_dropout: float) -> int:
    """Bytes one token stores in one decoder layer for the backward pass of LoRA SFT (bf16 activations).

    Counted tensor by tensor for a Qwen3/Llama layer with fused attention (SDPA or flash-attention: no
    sequence x sequence score matrix is kept), the way Korthikanti et al. (2022, "Reducing Activation
    Recomputation in Large Transformer Models", section 4.1) count a GPT layer's 34·h bytes, adapted to this layer:
      attention: the norm's input and output (2h), q, k, v projections (q + 2kv), q/k norm outputs (q + kv),
                 rotary outputs (q + kv), attention output (q)                          -> 2h + 4q + 4kv
      MLP:       the norm's input and output (2h), gate and up outputs, SiLU(gate), their product -> 2h + 4i
      LoRA:      with lora_dropout > 0, PEFT keeps each adapted projection's dropped-out input (q, k, v: 3h;
                 o: q; gate, up: 2h; down: i) and its mask (1 byte an element); every adapter keeps its rank-r
                 output (7r)
    all in bf16 (2 bytes). For Qwen3-1.7B this is 146 kB a layer, 4.1 MB a token over 28 layers; for Qwen3-0.6B
    2.5 MB a token (issue 35 counted "about 4" and "about 2.3"). fp32 upcasts inside RMSNorm and the loss are
    not counted."""
    h, q, kv, i = shape.hidden_size, shape.q_dim, shape.kv_dim, shape.intermediate_size
    elements = (2 * h + 4 * q + 4 * kv) + (2 * h + 4 * i) + 7 * lora_rank
    dropped = (5 * h + q + i) if lora_dropout > 0 else 0
    return BF16 * (elements + dropped) + dropped


def activation_bytes_per_token(shape: ModelShape, lora_rank: int, lora_dropout: float, checkpointing: bool) -> int:
    """Without checkpointing every layer keeps its activations; with it (transformers checkpoints each decoder
    layer) each layer keeps only its bf16 input, and one layer's activations exist again while it is recomputed.
    Either way the layer being differentiated also holds the gradients of its activations at the backward's peak
    (as many bytes again as it stores: one more layer)."""
    layer = layer_activation_bytes(shape, lora_rank, lora_dropout)
    if checkpointing:
        return shape.num_hidden_layers * BF16 * shape.hidden_size + 2 * layer
    return (shape.num_hidden_layers + 1) * layer


def fused_head_bytes(shape: ModelShape, *, tokens: int, scored: int, compute_bytes: int, triton: bool = True) -> float:
    """What TRL's fused LM head allocates at its peak (the backward) for `scored` labelled positions out of `tokens`.

    On CUDA (Triton present) `add_fused_lm_head` keeps only the labelled positions' hidden states
    (`hidden_states[mask]`, a copy) and `ChunkedLogProbFunction` projects them through one reused
    [min(scored, 4096), min(vocab, 32768)] tile in the compute dtype; no [tokens, vocab] logits tensor exists. Its
    backward accumulates the hidden states' gradient in fp32 and casts it back to the compute dtype, and autograd
    scatters that into a zero gradient of the whole backbone output (tokens x hidden). So:
      tile:            min(scored, 4096) x min(vocab, 32768) x compute bytes
      scored states:   scored x hidden x compute bytes (kept for the backward)
      their gradient:  scored x hidden x (4 + compute bytes)
      scattered back:  tokens x hidden x compute bytes
      per position:    scored x 12 fp32 values (FUSED_HEAD_STATS)
    Without Triton (the CPU: `train/lm_head.py` makes it compact there too) the tile is folded by torch ops, which
    hold about 5 fp32 copies of it at once (`_backward_tile`: the fp32 tile, log_p, p, the gradient, a product).
    The LM head itself is frozen (LoRA trains no embedding), so no [vocab, hidden] gradient is allocated."""
    tile_elements = min(scored, FUSED_HEAD_TILE_TOKENS) * min(shape.vocab_size, FUSED_HEAD_TILE_VOCAB)
    tile = tile_elements * (compute_bytes + (0 if triton else 5 * FP32))
    states = scored * shape.hidden_size * (compute_bytes + FP32 + compute_bytes)
    return tile + states + tokens * shape.hidden_size * compute_bytes + scored * FUSED_HEAD_STATS * FP32


@dataclass(frozen=True)
class TrainMemory:
    weights: float
    lora_states: float
    activations: float
    lm_head: float  # TRL's fused LM head (`fused_head_bytes`): tiles, never the full logits
    runtime: float = TRAIN_RUNTIME_BYTES

    @property
    def total(self) -> float:
        return self.weights + self.lora_states + self.activations + self.lm_head + self.runtime


def train_memory(shape: ModelShape, *, batch: int, max_length: int, lora_rank: int, lora_dropout: float,
                 checkpointing: bool, bf16: bool, world: int, zero_stage: int, scored: int | None = None,
                 on_gpu: bool = True) -> TrainMemory:
    """One rank of LoRA SFT: the frozen base in bf16 (fp32 without bf16), the LoRA weights, gradients and Adam's
    two moments in fp32 (16 bytes a parameter), activations for batch x max_length tokens (every row padded to
    max_length, the worst batch), and TRL's fused LM head over `scored` labelled positions (default: every token,
    the worst case; `fused_head_bytes`). ZeRO-2 shards the LoRA gradients and Adam states over the ranks; ZeRO-3
    also the weights (plus one gathered layer)."""
    params = shape.parameters()
    weight_bytes = params * (BF16 if bf16 else FP32)
    if zero_stage >= 3:
        weight_bytes = weight_bytes / world + weight_bytes / shape.num_hidden_layers
    lora = shape.lora_parameters(lora_rank)
    lora_states = lora * FP32 + lora * 3 * FP32 / (world if zero_stage >= 2 else 1)
    tokens = batch * max_length
    per_token = activation_bytes_per_token(shape, lora_rank, lora_dropout, checkpointing)
    head = fused_head_bytes(shape, tokens=tokens, scored=tokens if scored is None else scored,
                            compute_bytes=BF16 if bf16 else FP32, triton=on_gpu)
    return TrainMemory(weight_bytes, lora_states, tokens * per_token, head)


def kv_bytes_per_token(shape: ModelShape, tensor_parallel: int) -> float:
    """2 (K and V) x attention layers x KV heads x head_dim x 2 bytes (bf16 cache), per GPU: tensor parallelism
    splits the KV heads (a head is replicated when there are fewer heads than ranks)."""
    heads_per_gpu = max(1, shape.num_key_value_heads / tensor_parallel)
    return 2 * shape.attention_layers * heads_per_gpu * shape.head_dim * BF16


def linear_state_bytes_per_sequence(shape: ModelShape, tensor_parallel: int) -> float:
    """A hybrid model's linear-attention layers keep one recurrent state per sequence instead of a KV cache:
    value heads x key dim x value dim in fp32 (the larger of vLLM's choices), per layer, split by tensor parallelism."""
    state = shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim * FP32
    return shape.linear_layers * state / tensor_parallel


@dataclass(frozen=True)
class EngineMemory:
    weights: float
    loras: float
    runtime: float
    kv_per_sequence: float  # one sequence of max_model_len tokens
    budget: float  # gpu_memory_utilization x the GPU

    @property
    def fixed(self) -> float:
        return self.weights + self.loras + self.runtime

    @property
    def needed(self) -> float:
        """What vLLM refuses to start without: its weights, LoRA slots, runtime and one full-length sequence."""
        return self.fixed + self.kv_per_sequence

    @property
    def full_sequences(self) -> int:
        """How many max_model_len sequences the KV cache holds at once (vLLM queues the rest)."""
        return max(0, math.floor((self.budget - self.fixed) / self.kv_per_sequence))


def engine_memory(shape: ModelShape, *, tensor_parallel: int, max_model_len: int, max_loras: int, max_lora_rank: int,
                  budget: float, weight_bytes: int = BF16, runtime: float = VLLM_RUNTIME_BYTES) -> EngineMemory:
    """One GPU of a vLLM engine: weights / tp, the LoRA slots vLLM preallocates (max_loras adapters of
    max_lora_rank, in the model's dtype) / tp, its runtime, and the KV cache of one max_model_len sequence."""
    weights = shape.parameters() * weight_bytes / tensor_parallel
    loras = max_loras * shape.lora_parameters(max_lora_rank) * weight_bytes / tensor_parallel
    per_sequence = (max_model_len * kv_bytes_per_token(shape, tensor_parallel)
                    + linear_state_bytes_per_sequence(shape, tensor_parallel))
    return EngineMemory(weights, loras, runtime, per_sequence, budget)


def flat_index_bytes(passages: int, dim: int, dtype_bytes: int) -> float:
    """A flat (exact) index: every vector kept, passages x dim x bytes. The embedding memmap on disk is fp16 (2);
    FAISS's IndexFlatIP holds fp32 (4) in host memory, and fp16 (2) once cloned to GPUs (split over them)."""
    return passages * dim * dtype_bytes


def ivfpq_index_bytes(passages: int, dim: int, nlist: int, pq_m: int) -> float:
    """IVF-PQ: pq_m one-byte codes and an 8-byte id per passage, plus nlist fp32 centroids and the PQ codebooks
    (pq_m x 256 centroids of dim / pq_m floats)."""
    return passages * (pq_m + 8) + nlist * dim * FP32 + 256 * dim * FP32
