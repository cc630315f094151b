"""A role's JSON schema as a grammar on transformers' `generate`, compiled the way the deployed route compiles it.

The deployed agent decodes its structured roles on vLLM under xgrammar with `disable_any_whitespace`
(`llm.vllm_backend`): the JSON compiled with `any_whitespace=False` and the separators `(",", ":")`, which is what
vLLM's xgrammar backend passes for that flag. When RL samples a call of such a role on the trainer's own model
(`rl.rollout: hf`, `rl.decoding: deployed`), the same schema is compiled the same way with the same library and
applied through xgrammar's own transformers logits processor, so the policy samples from the distribution the
agent is deployed with (its logits masked to the schema) rather than a free one whose text the agent never emits.

xgrammar ships with vLLM (the `cpu` and `gpu` extras); a grammar is compiled once per schema and tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

from maps_train.agents.outputs import DEPLOYED_JSON_SEPARATORS as SEPARATORS
from maps_train.errors import MapsTrainError


class JsonGrammars:
    """Compiled JSON-schema grammars for one tokenizer; `processor(schema)` is a fresh logits processor (xgrammar's
    processor holds its matchers' state, so it serves one `generate` call)."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        try:
            import xgrammar
        except ImportError as err:  # pragma: no cover - xgrammar comes with vllm in both machine sets
            raise MapsTrainError("rl.decoding: deployed needs xgrammar (installed with the cpu or gpu extra) to "
                                 "sample a structured role under its schema; or set rl.decoding: free") from err
        self._xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgrammar.GrammarCompiler(info)
        self._compiled: dict[str, Any] = {}

    def compiled(self, schema: dict[str, Any]):
        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            self._compiled[key] = self.compiler.compile_json_schema(key, any_whitespace=False, separators=SEPARATORS)
        return self._compiled[key]

    def processor(self, schema: dict[str, Any]):
        """xgrammar's transformers processor for `schema`, on a copy of the scores: it masks them in place, and
        `generate(output_logits=True)` keeps that very tensor as the step's raw logits, whose unmasked
        log-probabilities are the ones the policy records (`maps_train.rl.policy`)."""
        from transformers import LogitsProcessor
        from xgrammar.contrib.hf import LogitsProcessor as GrammarProcessor

        grammar = GrammarProcessor(self.compiled(schema))

        class MaskedCopy(LogitsProcessor):
            def __call__(self, input_ids, scores):
                return grammar(input_ids, scores.clone())

        return MaskedCopy()

    def matcher(self, schema: dict[str, Any]):
        """A matcher over the schema (tests: whether a token sequence is one the grammar accepts)."""
        return self._xgr.GrammarMatcher(self.compiled(schema))
