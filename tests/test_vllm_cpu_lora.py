"""The grouped LoRA ops swapped into vLLM-CPU (maps_train/llm/vllm_cpu_lora.py) against vLLM's own reference ops.

Property tests draw the shapes vLLM hands these ops (tokens, slots, rank, hidden, [slots, 1, out, in] stacks),
token->slot indices with -1 rows, and both dtype paths; every op must write what `vllm.lora.ops.torch_ops` writes
into the same output tensor, where the slot that -1 reads in the reference (the last) is the spare, empty one
`platform.lora_slots` keeps. The fused `add_lora_linear` must write what vLLM's own wrapper method writes over those
reference ops, on a real `PunicaWrapperCPU` whose metadata vLLM's `update_metadata` set. The engine-level check (the
plugin loaded in vLLM's worker, outputs unchanged) is in tests/test_llm_vllm.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maps_train.llm import vllm_cpu_lora as grouped

reference = pytest.importorskip("vllm.lora.ops.torch_ops")

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def lora_case(draw):
    """(inputs, stacked weights, token indices, dtype): the last slot stays zero, as the spare slot does."""
    tokens = draw(st.integers(1, 24))
    slots = draw(st.integers(1, 4)) + 1  # + the spare slot
    rank, hidden = draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from([8, 24, 40]))
    shrink = draw(st.booleans())  # A: [slots, 1, rank, hidden] on hidden inputs; B: [slots, 1, hidden, rank]
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    out_dim, in_dim = (rank, hidden) if shrink else (hidden, rank)
    weights = torch.randn(slots, 1, out_dim, in_dim, generator=generator)
    weights[-1] = 0
    if draw(st.booleans()):
        weights = weights.squeeze(1)
    inputs = torch.randn(tokens, in_dim, generator=generator)
    indices = torch.tensor(draw(st.lists(st.integers(-1, slots - 2), min_size=tokens, max_size=tokens)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return inputs, weights, indices, dtype


def _both(call, out_shape, dtype, fill: float = 0.0):
    """Run one op pair on equal output tensors (pre-filled, for the add_inputs paths); returns (ours, vLLM's)."""
    base = torch.full(out_shape, fill, dtype=dtype)
    ours, theirs = base.clone(), base.clone()
    call(grouped, ours)
    call(reference, theirs)
    return ours, theirs


def _close(ours: torch.Tensor, theirs: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=tolerance, atol=tolerance)


@SETTINGS
@given(lora_case(), st.floats(0.25, 2.0))
def test_bgmv_shrink_matches_reference(case, scaling):
    inputs, weights, indices, dtype = case
    out_dim = weights.shape[-2]
    ours, theirs = _both(lambda ops, out: ops.bgmv_shrink(inputs, weights, out, indices, scaling),
                         (inputs.shape[0], out_dim), dtype)
    _close(ours, theirs, dtype)


@SETTINGS
@given(lora_case(), st.booleans())
def test_bgmv_expand_matches_reference(case, add_inputs):
    inputs, weights, indices, dtype = case
    out_dim = weights.shape[-2]
    ours, theirs = _both(lambda ops, out: ops.bgmv_expand(inputs, weights, out, indices, add_inputs),
                         (inputs.shape[0], out_dim + 3), dtype, fill=0.5)  # wider output: vLLM's padding case
    _close(ours, theirs, dtype)


@SETTINGS
@given(lora_case(), st.booleans(), st.integers(0, 5))
def test_bgmv_expand_slice_matches_reference(case, add_inputs, offset):
    inputs, weights, indices, dtype = case
    out_dim = weights.shape[-2]
    ours, theirs = _both(
        lambda ops, out: ops.bgmv_expand_slice(inputs, weights, out, indices, offset, out_dim, add_inputs),
        (inputs.shape[0], offset + out_dim + 2), dtype, fill=-0.25,
    )
    _close(ours, theirs, dtype)


@SETTINGS
@given(lora_case(), st.data())
def test_sgmv_ops_match_reference(case, data):
    """The prefill ops: one slot per sequence, sequences of drawn lengths that cover every token."""
    inputs, weights, _, dtype = case
    tokens, slots = inputs.shape[0], weights.shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(1, tokens - 1), unique=True, max_size=3)) if tokens > 1 else [])
    lengths = torch.tensor([b - a for a, b in zip([0, *cuts], [*cuts, tokens])])
    per_sequence = torch.tensor(data.draw(st.lists(st.integers(-1, slots - 2), min_size=len(lengths),
                                                   max_size=len(lengths))))
    starts = torch.cumsum(lengths, 0) - lengths
    shape = (len(lengths), int(lengths.max()), tokens)
    out_dim = weights.shape[-2]
    ours, theirs = _both(lambda ops, out: ops.sgmv_shrink(inputs, weights, out, starts, lengths, per_sequence,
                                                          *shape, 0.5), (tokens, out_dim), dtype)
    _close(ours, theirs, dtype)
    ours, theirs = _both(lambda ops, out: ops.sgmv_expand(inputs, weights, out, starts, lengths, per_sequence,
                                                          *shape, True), (tokens, out_dim), dtype, fill=1.0)
    _close(ours, theirs, dtype)
    ours, theirs = _both(lambda ops, out: ops.sgmv_expand_slice(inputs, weights, out, starts, lengths, per_sequence,
                                                                *shape, 2, out_dim, False),
                         (tokens, out_dim + 4), dtype, fill=1.0)
    _close(ours, theirs, dtype)


def test_one_adapter_for_the_whole_batch_is_one_matmul_and_minus_one_rows_are_zero():
    weights = torch.randn(3, 4, 8)
    inputs = torch.randn(5, 8)
    same = grouped.grouped_lora_matmul(inputs, weights, torch.full((5,), 1), torch.float32)
    torch.testing.assert_close(same, inputs @ weights[1].T)
    mixed = grouped.grouped_lora_matmul(inputs, weights, torch.tensor([0, -1, 1, -1, 0]), torch.float32)
    torch.testing.assert_close(mixed[[1, 3]], torch.zeros(2, 4))
    torch.testing.assert_close(mixed[2], inputs[2] @ weights[1].T)


def test_one_input_row_is_broadcast_over_a_longer_output_as_the_reference_does():
    weights = torch.randn(3, 1, 6, 4)
    inputs = torch.randn(1, 4)
    for add in (True, False):
        ours, theirs = _both(lambda ops, out, add=add: ops.bgmv_expand(inputs, weights, out, torch.tensor([1]), add),
                             (5, 8), torch.float32, fill=0.5)
        _close(ours, theirs, torch.float32)


def test_an_index_buffer_updated_in_place_gets_its_new_grouping():
    """vLLM rewrites its token->slot buffers in place between steps (under inference mode): the per-step grouping
    cache must key on the values, never on the tensor object."""
    weights = torch.randn(4, 1, 8, 6)
    weights[-1] = 0
    inputs = torch.randn(6, 6)
    indices, lengths = torch.tensor([0, 0, 1, 1, 2, -1]), torch.tensor([4, 2])
    with torch.inference_mode():
        for values in ([0, 0, 1, 1, 2, -1], [2, 2, 2, 2, 2, 2], [1, -1, 0, 2, 0, 1], [-1] * 6, [0, 0, 1, 1, 2, -1]):
            indices.copy_(torch.tensor(values))
            ours, theirs = _both(lambda ops, out: ops.bgmv_shrink(inputs, weights, out, indices, 1.0), (6, 8),
                                 torch.float32)
            _close(ours, theirs, torch.float32)
            ours, theirs = _both(lambda ops, out, seqs=torch.tensor(values[:2]): ops.sgmv_shrink(
                inputs, weights, out, None, lengths, seqs, 2, 4, 6, 1.0), (6, 8), torch.float32)
            _close(ours, theirs, torch.float32)


def test_install_swaps_the_cpu_wrapper_ops_and_the_switch_keeps_vllms(monkeypatch):
    from vllm.lora.punica_wrapper import punica_cpu

    saved = {name: getattr(punica_cpu, name) for name in grouped.OPS}
    method = punica_cpu.PunicaWrapperCPU.add_lora_linear
    try:
        monkeypatch.setenv(grouped.SWITCH, "reference")
        assert grouped.install() is False
        assert all(getattr(punica_cpu, name) is saved[name] for name in grouped.OPS)
        assert punica_cpu.PunicaWrapperCPU.add_lora_linear is method
        punica_cpu.PunicaWrapperCPU.add_lora_linear = grouped.VLLM_OWN.get("add_lora_linear", method)
        monkeypatch.setenv(grouped.SWITCH, "ops")  # the grouped ops under vLLM's own method
        assert grouped.install() is True
        assert all(getattr(punica_cpu, name) is getattr(grouped, name) for name in grouped.OPS)
        assert punica_cpu.PunicaWrapperCPU.add_lora_linear is not grouped.add_lora_linear
        monkeypatch.delenv(grouped.SWITCH)
        assert grouped.install() is True
        assert all(getattr(punica_cpu, name) is getattr(grouped, name) for name in grouped.OPS)
        assert punica_cpu.PunicaWrapperCPU.add_lora_linear is grouped.add_lora_linear
        assert grouped.VLLM_OWN["add_lora_linear"] is not grouped.add_lora_linear  # vLLM's, kept to compare
    finally:
        for name, op in saved.items():
            setattr(punica_cpu, name, op)
        punica_cpu.PunicaWrapperCPU.add_lora_linear = method


def test_the_plugin_is_registered_with_vllm():
    from importlib.metadata import entry_points

    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("maps_train") == "maps_train.llm.vllm_cpu_lora:register"


@st.composite
def linear_case(draw):
    """One LoRA-wrapped projection as vLLM's CPU wrapper gets it: inputs, per-slice stacked A and B (the spare last
    slot zero), each token's LoRA id (0: the base model) and whether the step is a prefill."""
    tokens, loras = draw(st.integers(1, 20)), draw(st.integers(1, 3))
    rank, width = draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from([8, 24, 40]))
    slices = tuple(draw(st.lists(st.sampled_from([8, 16, 24]), min_size=1, max_size=3)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    a = tuple(torch.randn(loras + 1, 1, rank, width, generator=generator) for _ in slices)
    b = tuple(torch.randn(loras + 1, 1, out, rank, generator=generator) for out in slices)
    for stack in a + b:
        stack[-1] = 0
    ids = draw(st.lists(st.integers(0, loras), min_size=tokens, max_size=tokens))
    if draw(st.booleans()):  # a prefill's tokens come in runs, one per request
        ids = sorted(ids)
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    return torch.randn(tokens, width, generator=generator).to(dtype), a, b, slices, ids, loras, dtype


def _wrapper(ids: list[int], loras: int, prefill: bool):
    from vllm.lora.layers import LoRAMapping
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    wrapper = PunicaWrapperCPU(64, 64, "cpu")
    wrapper.update_metadata(LoRAMapping(tuple(ids), tuple(ids), is_prefill=prefill),
                            [*range(1, loras + 1), None], loras + 1, 100)
    return wrapper


@SETTINGS
@given(linear_case(), st.booleans(), st.sampled_from([1.0, 0.5]))
def test_add_lora_linear_matches_vllms_wrapper_over_its_reference_ops(case, prefill, scale):
    from vllm.lora.punica_wrapper import punica_cpu

    grouped.install()
    x, a, b, slices, ids, loras, dtype = case
    wrapper = _wrapper(ids, loras, prefill)
    base = torch.randn(x.shape[0], sum(slices)).to(dtype)
    ours, theirs = base.clone(), base.clone()
    grouped.add_lora_linear(wrapper, ours, x, a, b, scale, slices)
    with pytest.MonkeyPatch.context() as patch:
        for name in grouped.OPS:
            patch.setattr(punica_cpu, name, getattr(reference, name))
        grouped.VLLM_OWN["add_lora_linear"](wrapper, theirs, x, a, b, scale, slices)
    _close(ours, theirs, dtype)
    if not any(ids):
        assert torch.equal(ours, base)  # a step on the base model only: nothing added

