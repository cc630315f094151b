"""TRL's fused LM head on the CPU, compact (labelled positions only) vs as TRL ships it (every position).

Real components: the tiny Qwen3, PEFT LoRA on every projection, TRL's own `add_fused_lm_head` and chunked
log-prob kernel. The compact head must give the same loss, LoRA gradients and logged metrics while projecting
only the positions that carry a label.
"""

from __future__ import annotations

import pytest
import torch

from maps_train.train import lm_head


@pytest.fixture
def fused_lora_model(tiny_qwen3):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # as SFTTrainer does, before PEFT
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"],
                                                  lora_dropout=0.0, init_lora_weights=False))
    yield peft_model
    lm_head.restore()


def _batch(vocab: int):
    """Two right-padded prompt-completion rows: labels only on the completions (-100 on prompts and padding)."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(5, vocab, (2, 40), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 31:] = 0
    labels = torch.full_like(input_ids, -100)
    labels[0, 33:40] = input_ids[0, 33:40]
    labels[1, 25:31] = input_ids[1, 25:31]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _step(model, batch, monkeypatch):
    import trl.trainer.utils as trl_utils

    rows = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def counting(hidden, *args):
        rows.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", counting)
    model.zero_grad()
    outputs = model(**batch, fused_lm_head=True)
    outputs.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    monkeypatch.undo()
    return outputs, grads, rows


def test_compact_head_scores_only_labelled_positions_with_the_same_loss_and_gradients(fused_lora_model, monkeypatch):
    model = fused_lora_model
    batch = _batch(model.config.vocab_size)
    labelled = int((batch["labels"][:, 1:] != -100).sum())  # 6 + 6 next-token targets after the shift

    lm_head.restore()
    full, full_grads, full_rows = _step(model, batch, monkeypatch)
    assert lm_head.score_labelled_positions_only() is True
    assert lm_head.score_labelled_positions_only() is True  # idempotent
    compact, compact_grads, compact_rows = _step(model, batch, monkeypatch)

    assert full_rows == [2 * 39]  # TRL on the CPU: every position of both rows
    assert compact_rows == [labelled]  # compact: the completion targets only
    torch.testing.assert_close(compact.loss, full.loss, rtol=1e-5, atol=1e-6)
    mask = full.label_mask
    assert torch.equal(mask, compact.label_mask)
    torch.testing.assert_close(compact.log_probs[mask], full.log_probs[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compact.entropy[mask], full.entropy[mask], rtol=1e-5, atol=1e-5)
    assert torch.equal(compact.is_top1[mask], full.is_top1[mask])
    assert full_grads.keys() == compact_grads.keys() and full_grads
    for name in full_grads:
        torch.testing.assert_close(compact_grads[name], full_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert any(g.abs().sum() > 0 for g in compact_grads.values())


def test_restore_puts_trls_decision_back():
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton
    lm_head.score_labelled_positions_only()
    assert trl_utils._use_triton(torch.device("cpu")) is True
    lm_head.restore()
    assert trl_utils._use_triton is original
