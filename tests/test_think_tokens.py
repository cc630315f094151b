"""Whether `<think>` and `</think>` are special tokens decides whether a decoder that skips special tokens keeps them
(issue 46). Qwen3's tokenizer_config.json marks them `"special": false` (ids 151667/151668; the tiny Qwen3's
tokenizer.json copies that). Qwen3.6's own files could not be read: the Hub is out of reach, and no stored copy of
Qwen/Qwen3.6-35B-A3B's (or any Qwen3.5's) tokenizer_config.json or tokenizer.json turned up in the public code,
docs, issue or web-page indexes searched. What turned up is indirect: the Qwen3.5/3.6 vocabulary holds the tags at
ids 248068/248069 (vLLM issue #39697 names 248069 as Qwen3.5's `</think>`); the tokenizer_config.json of a Qwen3.5
fine-tune seen on a Hub mirror (hellohazime/qwen35-2b-openclaw-termux-stage1) is in transformers 5's layout, with no
`added_tokens_decoder` and no think tag among its special tokens, so the flag lives in tokenizer.json, as in the
tiny Qwen3 here; and two third-party test fixtures that copy Qwen3.5's added tokens give both tags `"special":
false`. Not the file itself, so every backend decodes correctly either way, and these tests mark the tags special on
copies of the tiny Qwen3 in both places a tokenizer can say so: tokenizer.json's `added_tokens` flag, and
tokenizer_config.json's `extra_special_tokens` list (transformers 5 then counts them in `all_special_ids` although
its own decode keeps them; a slow detokenizer that skips `all_special_ids` would not). transformers' text keeps
`</think>` (the answer is split off the reasoning), in-process vLLM is asked not to skip special tokens, and so is
`vllm serve` for a raw continuation."""

from __future__ import annotations

import json
import shutil

import pytest

from maps_train.llm.call_spec import call_spec
from maps_train.llm.thinking import decode_generated, think_tags_special
from maps_train.llm.types import ChatRequest
from maps_train.recipe import BackendConfig, RoleRoute

REPLY = "<think>\nThe tower is in Paris.\n</think>\n\nParis"


@pytest.fixture(scope="module", params=["tokenizer.json", "extra_special_tokens"])
def special_think(request, tiny_qwen3, tmp_path_factory):
    """The tiny Qwen3 with `<think>`/`</think>` marked special: flagged in tokenizer.json's `added_tokens`, or listed
    under `extra_special_tokens` in its tokenizer_config.json (tokenizer.json's flags left false)."""
    folder = tmp_path_factory.mktemp("tiny-qwen3-special-think") / "model"
    shutil.copytree(tiny_qwen3, folder)
    if request.param == "tokenizer.json":
        tokenizer_json = json.loads((folder / "tokenizer.json").read_text())
        for token in tokenizer_json["added_tokens"]:
            if token["content"] in ("<think>", "</think>"):
                token["special"] = True
        (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["extra_special_tokens"] = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


def test_think_tags_are_read_as_special_or_not(tiny_qwen3, special_think):
    from transformers import AutoTokenizer

    plain, special = AutoTokenizer.from_pretrained(tiny_qwen3), AutoTokenizer.from_pretrained(special_think)
    assert not think_tags_special(plain) and think_tags_special(special)
    ids = special(REPLY, add_special_tokens=False)["input_ids"] + [special.eos_token_id]
    assert plain.decode(ids, skip_special_tokens=True) == REPLY  # not special (Qwen3): a plain skip keeps them
    if special.added_tokens_decoder[ids[0]].special:  # flagged in tokenizer.json: a plain skip drops the tags
        assert "</think>" not in special.decode(ids, skip_special_tokens=True)  # what the backends did
    assert decode_generated(special, ids) == REPLY == decode_generated(plain, ids)


def test_transformers_keeps_special_think_tags_and_splits_the_answer(special_think):
    import torch

    from maps_train.llm.hf_backend import HFBackend

    backend = HFBackend(special_think, BackendConfig(dtype="float32", max_model_len=512))
    tok = backend.tokenizer
    reply = tok(REPLY, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def scripted(input_ids, **kwargs):
        return torch.cat([input_ids, torch.tensor([reply], dtype=input_ids.dtype)], dim=1)

    backend.model.generate = scripted
    route = RoleRoute(backend="hf", model=special_think, enable_thinking=True, max_tokens=64)
    [completion] = backend.generate([ChatRequest(role="answer", messages=[{"role": "user", "content": "Where?"}])],
                                    [route])
    assert completion.text == "Paris" and completion.reasoning == "The tower is in Paris."
    assert completion.generated == REPLY


def test_vllm_and_the_server_are_asked_to_keep_special_think_tags(special_think):
    from maps_train.llm.openai_backend import OpenAIBackend
    from maps_train.llm.vllm_backend import VLLMBackend

    spec = call_spec(ChatRequest(role="r", messages=[], raw_continuation=""), RoleRoute(model=special_think))
    assert VLLMBackend.sampling_params(spec, keep_think_tags=True).skip_special_tokens is False
    assert VLLMBackend.sampling_params(spec).skip_special_tokens is True
    backend = OpenAIBackend(BackendConfig())
    try:
        body = backend.completion_body(spec, "prompt")
    finally:
        backend.close()
    assert body["extra_body"]["skip_special_tokens"] is False
