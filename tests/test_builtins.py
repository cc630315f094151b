"""The three builtin models materialise offline and load; hub ids offline fail with one helpful line."""

from __future__ import annotations

import pytest
import torch

from maps_train.errors import MapsTrainError
from maps_train.models import resolve_model


def test_tiny_qwen3_generates_with_thinking_switch(tiny_qwen3):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3)
    assert model.config.model_type == "qwen3" and len(tokenizer) <= 2048
    messages = [{"role": "user", "content": "Who wrote the letter?"}]
    off = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    on = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not on.endswith("</think>\n\n")
    ids = tokenizer(off, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.input_ids.shape[1]


def test_minilm_embeds(minilm):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(minilm, device="cpu")
    emb = model.encode(["Paris is the capital of France.", "The capital of France is Paris.", "Bananas are yellow."],
                       normalize_embeddings=True)
    assert emb.shape == (3, 384)
    assert emb[0] @ emb[1] > emb[0] @ emb[2]


@pytest.mark.slow
def test_smollm2_answers_a_chat_prompt(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "paris" in tokenizer.decode(out[0][ids["input_ids"].shape[1]:]).lower()


def test_smollm2_names_the_token_that_ends_its_turn_as_eos(smollm2):
    """The tokenizer's EOS is the token the model ends a turn with (the GGUF's eos id, `<|im_end|>`): what xgrammar's
    stop token, the HF backend's stop list and TRL's appended EOS read. The GGUF conversion alone names `<|im_start|>`."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    generation = json.loads((Path(smollm2) / "generation_config.json").read_text())
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.pad_token) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    assert tokenizer.eos_token_id == generation["eos_token_id"] == 2
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
                                         tokenize=False)
    assert chat.rstrip("\n").endswith("Hello" + tokenizer.eos_token)


def test_unknown_builtin_and_offline_hub_id(monkeypatch):
    with pytest.raises(MapsTrainError, match=r"builtin:nope: unknown builtin"):
        resolve_model("builtin:nope")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MapsTrainError, match=r"Qwen/Qwen3-0.6B-Nonexistent': not in the local Hugging Face cache.*builtin:tiny-qwen3"):
        resolve_model("Qwen/Qwen3-0.6B-Nonexistent")
    with pytest.raises(MapsTrainError, match=r"no such local path"):
        resolve_model("./missing/model")
