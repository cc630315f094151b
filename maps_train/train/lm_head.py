"""TRL's fused LM head, told to score only the positions that carry a label on the CPU too.

TRL's `SFTTrainer` takes the loss through a fused LM head (`trl.trainer.utils.add_fused_lm_head`): the per-token
log-probabilities of the targets, projected tile by tile instead of as one `[batch, seq, vocab]` logits tensor. On
a device with Triton (CUDA, XPU) it projects only the positions whose label is not -100. Everywhere else it
projects every position and masks afterwards, because on compiling devices (Neuron) a varying count of positions
would recompile the graph every batch. The CPU recompiles nothing, and a role call's SFT row is mostly prompt
(the completion is a small part of its tokens, every prompt position labelled -100), so there TRL spends its
vocabulary projection, softmax statistics and their backward on positions whose result is multiplied by zero:
about half of a demo training step, profiled in docs/throughput.md.

`score_labelled_positions_only()` makes the fused head compact on the CPU as well. The loss, the gradients and
TRL's logged metrics (entropy, token accuracy) are the same, only computed on fewer rows (tests/test_lm_head.py
compares them with and without). It changes one decision inside TRL, `trl.trainer.utils._use_triton` as read by
the fused forward, and nothing else: the kernel module keeps its own binding, so the CPU still runs TRL's torch
tiles, not Triton. A TRL without that name is left alone (training stays correct, only slower) with a warning.
"""

from __future__ import annotations

import logging

from maps_train.train import internals

logger = logging.getLogger(__name__)

_MARK = "_maps_train_compact_on_cpu"


def score_labelled_positions_only() -> bool:
    """Make TRL's fused LM head project only labelled positions on the CPU; True when it now does (idempotent)."""
    decide = internals.trl_use_triton()
    if decide is None:
        if internals.trl_installed():
            logger.warning("trl %s has no trainer.utils._use_triton: its fused LM head may score prompt positions "
                           "on the CPU too (correct, slower)", _trl_version())
        return False
    if getattr(decide, _MARK, False):
        return True

    def compact_on_cpu(device) -> bool:
        return getattr(device, "type", None) == "cpu" or decide(device)

    setattr(compact_on_cpu, _MARK, True)
    compact_on_cpu.original = decide  # type: ignore[attr-defined]
    internals.set_trl_use_triton(compact_on_cpu)
    return True


def restore() -> None:
    """Undo `score_labelled_positions_only()` (for tests comparing both)."""
    decide = internals.trl_use_triton()
    if getattr(decide, _MARK, False):
        internals.set_trl_use_triton(decide.original)


def _trl_version() -> str:
    from importlib.metadata import version

    return version("trl")
