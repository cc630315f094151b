"""Grouped LoRA matmuls for vLLM's CPU build, installed as a vLLM general plugin.

vLLM-CPU runs multi-LoRA through PyTorch reference ops (`vllm.lora.ops.torch_ops`) that gather every token's own
copy of its adapter's weights (`weights[indices]`, one [rank x hidden] matrix per token and projection) and then
multiply token by token (`einsum("bi,boi->bo")`). A batch holds a handful of adapters, so the same product is a few
dense matmuls (`add_lora`), and every op call of a forward pass (420 in SmolLM2-135M: 14 a layer) shares one
grouping of the batch's rows by adapter, worked out once (`RowAdapters`, cached by value).
`bench/bench_lora_ops.py` replays one forward pass's calls at SmolLM2-135M's shapes (r=16, 3 adapters);
`bench/bench_serve.py` runs MAPS through `vllm serve` with the adapters vs the base model; docs/throughput.md has
the figures.

One level up, `add_lora_linear` replaces the wrapper's method of that name, which made one shrink and one expand
op call per output slice of every projection (qkv has three, gate_up two): it does a projection's shrink in one
matmul and its expand in one a slice, which cuts the per-call overhead that bounded small decode batches.

`register()` (entry point `vllm.general_plugins` -> `maps_train`, which vLLM calls in every engine-core and
worker process of the environment) acts only in maps-train's own processes: those with `MAPS_TRAIN_VLLM_CPU_LORA`
set, as `platform.apply_runtime_defaults` sets it for `maps-train serve`, the in-process engine and every entry
point, and as vLLM's processes inherit it; any other vLLM process loads the plugin and changes nothing. It swaps
those six ops in the CPU punica
wrapper for the grouped ones below, and its `add_lora_linear` for the fused one, on the CPU platform only. They
keep vLLM's signatures and results, with one difference: a row whose index is -1 (no adapter) gets a zero LoRA
term, where the reference reads the last slot (harmless only while that slot stays empty, see
`platform.lora_slots`).
`MAPS_TRAIN_VLLM_CPU_LORA=grouped` (the default maps-train sets) installs both; `=reference` keeps vLLM's own ops and method (to compare, or if a vLLM release changes
them); `=ops` installs the grouped ops under vLLM's own method.
"""

from __future__ import annotations

import logging
import os

import torch

from maps_train.llm import vllm_internals

log = logging.getLogger(__name__)
OPS = ("bgmv_expand", "bgmv_expand_slice", "bgmv_shrink", "sgmv_expand", "sgmv_expand_slice", "sgmv_shrink")
SWITCH = "MAPS_TRAIN_VLLM_CPU_LORA"


def _stacked(weights: torch.Tensor) -> torch.Tensor:
    """vLLM's stacked LoRA A or B matrices, [slots, out, in] or [slots, 1, out, in], as [slots, out, in]."""
    return weights.squeeze(1) if weights.dim() == 4 else weights


class RowAdapters:
    """Which adapter each row of one batch uses, worked out once per batch: the adapters present (slots >= 0),
    how to pick their weights out of vLLM's stacks (`slots`: a slice when they are consecutive, as vLLM fills them,
    so the pick is a view), whether one of them covers every row, and else a one-hot [rows, adapters] mask (all
    zero on -1 rows)."""

    def __init__(self, indices: torch.Tensor):
        self.adapters = [slot for slot in torch.unique(indices).tolist() if slot >= 0]
        first = self.adapters[0] if self.adapters else 0
        consecutive = self.adapters == list(range(first, first + len(self.adapters)))
        self.slots = slice(first, first + len(self.adapters)) if consecutive else \
            torch.tensor(self.adapters, device=indices.device)
        self.whole = len(self.adapters) == 1 and bool((indices == self.adapters[0]).all())
        self._onehot = None if self.whole or not self.adapters else \
            indices[:, None] == torch.tensor(self.adapters, device=indices.device)[None, :]
        self._masks: dict[torch.dtype, torch.Tensor] = {}

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in self._masks:
            self._masks[dtype] = self._onehot.to(dtype)
        return self._masks[dtype]


class _Recent:
    """The last few values seen for a key of small index tensors, by value: every op call of a forward pass
    (420 op calls in SmolLM2-135M) gets the same token->slot indices, so their grouping is worked out once per step.
    vLLM updates its index buffers in place (under inference mode, which keeps no version counters), so the
    cache compares values, which costs one small `torch.equal` per call instead of a sort."""

    def __init__(self, size: int = 4):
        self.size, self.entries = size, []

    def get(self, key: tuple[torch.Tensor, ...], build):
        for stored, value in self.entries:
            if all(torch.equal(a, b) for a, b in zip(stored, key)):  # False on different shapes too
                return value
        value = build()
        self.entries.insert(0, (tuple(t.clone() for t in key), value))
        del self.entries[self.size:]
        return value


_layouts, _exploded = _Recent(), _Recent()
VLLM_OWN: dict[str, object] = {}  # the wrapper methods install() replaced, as vLLM wrote them (to compare)


def add_lora(target: torch.Tensor, inputs: torch.Tensor, weights: torch.Tensor, rows: RowAdapters, add: bool,
             scaling: float = 1.0) -> None:
    """target (+)= scaling * (row i: `inputs[i] @ weights[slot_i].T`), computed in target's dtype. Rows without an
    adapter get 0 (assign) or stay as they are (add); weights' output columns beyond target's width are dropped
    (adapter and model may pad differently), and one input row against more target rows is broadcast over them.

    One adapter for the batch is one matmul. A mixed batch gathers and scatters no rows: the expand side (B, a
    small input: the rank) adds one masked matmul per adapter present straight into the target; the shrink side
    (A, a small output: the rank) multiplies every row by all present adapters' A at once and keeps each row's
    own block. At rank 16 and three adapters this costs a fraction of the base projection."""
    if not rows.adapters:
        if not add:
            target.zero_()
        return
    dtype = target.dtype
    weights, inputs = _stacked(weights)[:, : target.shape[1]], inputs.to(dtype)
    if rows.whole:
        weight = weights[rows.adapters[0]].to(dtype)
        if add and inputs.shape[0] == target.shape[0]:
            target.addmm_(inputs, weight.T, alpha=scaling)
        else:
            _write(target, inputs @ weight.T, add, scaling)
        return
    present = weights[rows.slots].to(dtype)  # [adapters, out, in]
    count, out_dim, in_dim = present.shape
    mask = rows.mask(dtype)
    if in_dim <= out_dim:
        if not add:
            target.zero_()
        for block, weight in enumerate(present):
            target.addmm_(inputs * mask[:, block: block + 1], weight.T, alpha=scaling)
        return
    products = (inputs @ present.reshape(count * out_dim, in_dim).T).view(inputs.shape[0], count, out_dim)
    _write(target, torch.bmm(mask[:, None, :], products).squeeze(1), add, scaling)


def _write(target: torch.Tensor, product: torch.Tensor, add: bool, scaling: float) -> None:
    if add:
        target.add_(product, alpha=scaling)
    else:
        target.copy_(product)
        if scaling != 1.0:
            target.mul_(scaling)


def grouped_lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    """Row i of the result is `inputs[i] @ weights[indices[i]].T`, and zero where `indices[i] < 0`."""
    outputs = inputs.new_empty(inputs.shape[0], _stacked(weights).shape[1], dtype=dtype)
    add_lora(outputs, inputs, weights, RowAdapters(indices[: inputs.shape[0]]), add=False)
    return outputs


def _rows(inputs: torch.Tensor, indices: torch.Tensor) -> RowAdapters:
    """The grouping of `inputs`' rows, from the step's cache."""
    indices = indices[: inputs.shape[0]]
    return _layouts.get((indices,), lambda: RowAdapters(indices))


def _per_token(lora_indices: torch.Tensor, seq_len_tensor: torch.Tensor) -> torch.Tensor:
    return _exploded.get((lora_indices, seq_len_tensor), lambda: torch.repeat_interleave(lora_indices, seq_len_tensor))


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling: float = 1.0):
    rank = _stacked(lora_a_weights).shape[1]
    add_lora(output_tensor[: inputs.shape[0], :rank], inputs, lora_a_weights, _rows(inputs, lora_indices_tensor),
             add=False, scaling=scaling)


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs: bool = True):
    common = min(_stacked(lora_b_weights).shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    # One input row against a longer output: that row's term broadcast over every output row (as the reference does).
    broadcast = inputs.shape[0] == 1 and output_tensor.shape[0] != 1
    add_lora(output_tensor[:, :common] if broadcast else output_tensor[: inputs.shape[0], :common], inputs,
             lora_b_weights, _rows(inputs, lora_indices_tensor), add=add_inputs)


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset: int,
                      slice_size: int, add_inputs: bool = True):
    add_lora(output_tensor[: inputs.shape[0], slice_offset: slice_offset + slice_size], inputs, lora_b_weights,
             _rows(inputs, lora_indices_tensor), add=add_inputs)


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


def add_lora_linear(self, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: tuple[torch.Tensor, ...],
                    lora_b_stacked: tuple[torch.Tensor, ...], scale: float, output_slices: tuple[int, ...], *,
                    buffer: tuple[torch.Tensor, ...] | None = None, **kwargs) -> None:
    """`PunicaWrapperCPU.add_lora_linear` in one go instead of one shrink and one expand op call per output slice
    (qkv has three, gate_up two): the per-call overhead bounded small decode batches. Same result as the wrapper's
    own method over the ops above; `buffer` (a GPU path's scratch space) is not needed."""
    if self.is_prefill and self.no_lora:  # every row on the base model (vLLM's V1 runner always sets is_prefill)
        return
    x, y = x.view(-1, x.shape[-1]), y.view(-1, y.shape[-1])
    rows = _rows(x, self.token_lora_indices)
    if rows.adapters:
        add_lora_slices(y, x, [_stacked(a) for a in lora_a_stacked], [_stacked(b) for b in lora_b_stacked],
                        output_slices, rows, scale)


def add_lora_slices(target: torch.Tensor, inputs: torch.Tensor, a_stacks: list[torch.Tensor],
                    b_stacks: list[torch.Tensor], slices: tuple[int, ...], rows: RowAdapters, scale: float) -> None:
    """For each output slice i (widths `slices`, side by side from column 0) and each row with an adapter:
    target[row, slice i] += (scale * inputs[row] @ A_i[slot].T) @ B_i[slot].T, the shrink in float32 and the expand
    in target's dtype, as vLLM's float32 buffer between them does. Rows without an adapter are left as they are.

    The shrink is one matmul over every slice's A (and every present adapter's, keeping each row's own block); the
    expand is one matmul a slice, over every present adapter's B at once (each row's rank vector spread into its
    adapter's block, zero elsewhere), so a projection costs a handful of calls whatever the batch's mix."""
    dtype, ranks = target.dtype, [a.shape[1] for a in a_stacks]
    inputs32 = inputs.to(torch.float32)
    if rows.whole:
        slot = rows.adapters[0]
        a = torch.cat([a[slot] for a in a_stacks]) if len(a_stacks) > 1 else a_stacks[0][slot]
        hidden = inputs32 @ a.to(torch.float32).T  # [rows, sum of ranks]
    else:
        present = torch.cat([a[rows.slots] for a in a_stacks], dim=1) if len(a_stacks) > 1 else a_stacks[0][rows.slots]
        count, total_rank, width = present.shape
        products = (inputs32 @ present.reshape(count * total_rank, width).to(torch.float32).T)
        hidden = torch.bmm(rows.mask(torch.float32)[:, None, :], products.view(-1, count, total_rank)).squeeze(1)
    if scale != 1.0:
        hidden.mul_(scale)
    hidden = hidden.to(dtype)
    column = first_rank = 0
    for b, width, rank in zip(b_stacks, slices, ranks):
        out, part = target[:, column: column + width], hidden[:, first_rank: first_rank + rank]
        if rows.whole:
            out.addmm_(part, b[rows.adapters[0], :width].to(dtype).T)
        else:
            spread = (part[:, None, :] * rows.mask(dtype)[:, :, None]).reshape(part.shape[0], -1)
            present = b[rows.slots, :width].to(dtype)  # [adapters, width, rank]
            out.addmm_(spread, present.permute(1, 0, 2).reshape(present.shape[1], -1).T)
        column, first_rank = column + width, first_rank + rank


def install() -> bool:
    """Swap the grouped ops (and, unless the switch says `ops`, the fused `add_lora_linear`) into vLLM's CPU punica
    wrapper; False (and nothing changed) where they don't apply."""
    choice = os.environ.get(SWITCH, "grouped").strip().lower()
    if choice == "reference":
        return False
    punica_cpu = vllm_internals.cpu_punica()
    if punica_cpu is None:  # a vLLM without the CPU LoRA path
        return False
    missing = [name for name in OPS if not hasattr(punica_cpu, name)]
    wrapper = getattr(punica_cpu, "PunicaWrapperCPU", None)
    missing += [f"PunicaWrapperCPU.{name}" for name in ("add_lora_linear", "token_lora_indices")
                if not hasattr(wrapper, name)]
    if missing:
        log.warning("maps-train: vLLM's CPU LoRA ops changed (%s missing); keeping vLLM's own", ", ".join(missing))
        return False
    # `ops`: the grouped ops under vLLM's own wrapper method (to measure what fusing gains)
    before = vllm_internals.patch_cpu_punica({name: globals()[name] for name in OPS},
                                             None if choice == "ops" else add_lora_linear)
    if before is not add_lora_linear:
        VLLM_OWN.setdefault("add_lora_linear", before)
    return True


def register() -> None:
    """vLLM general plugin: in a maps-train process (`SWITCH` set) on the CPU platform, use the grouped LoRA ops
    (loaded once per vLLM process); in any other vLLM process, nothing."""
    from maps_train.platform import vllm_on_cpu

    if SWITCH not in os.environ:
        return
    if vllm_on_cpu() and install():
        log.info("maps-train: grouped LoRA matmuls installed in vLLM's CPU punica wrapper")
