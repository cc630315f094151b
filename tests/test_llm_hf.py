"""The transformers+PEFT backend and the router on the tiny Qwen3 with real LoRA adapters."""

from __future__ import annotations

import pytest

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.router import Router, build_router
from maps_train.recipe import Recipe, RoleRoute

QUESTIONS = ["Who wrote Hamlet?", "Capital of France?", "What is 2+2?"]


def _msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": text}]


@pytest.fixture(scope="module")
def qwen_adapters(tiny_qwen3, make_lora_adapters):
    return make_lora_adapters(tiny_qwen3, ["proposer", "writer", "consolidator"])


@pytest.fixture(scope="module")
def routes(tiny_qwen3, qwen_adapters):
    table = {"default": RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=12)}
    for role, path in qwen_adapters.items():
        table[role] = RoleRoute(backend="hf", model=tiny_qwen3, adapter=path, max_tokens=12)
    return table


def _texts(router: Router, role: str) -> list[str]:
    return [c.text for c in router.generate([ChatRequest(role=role, messages=_msgs(q)) for q in QUESTIONS])]


def test_adapters_change_outputs_and_mixed_batch_equals_separate_runs(hf_tiny_qwen3, routes):
    router = Router(routes, backends={"hf": hf_tiny_qwen3})
    base = _texts(router, "answer")  # falls back to the default route: the bare model
    single = {role: _texts(router, role) for role in ("proposer", "writer", "consolidator")}
    for role, texts in single.items():
        assert texts != base, role
        assert all(t != b for t, b in zip(texts, base)), role
    assert single["proposer"] != single["writer"]

    # one mixed batch: every question under every route, interleaved
    roles = ["answer", "proposer", "writer", "consolidator"]
    mixed = [
        ChatRequest(role=r, messages=_msgs(q), question_id=f"q{i}") for i, q in enumerate(QUESTIONS) for r in roles
    ]
    out = router.generate(mixed)
    expected = {"answer": base, **single}
    for n, (req, comp) in enumerate(zip(mixed, out)):
        assert comp.text == expected[req.role][n // len(roles)], (req.role, n)
        assert comp.role == req.role
        assert comp.adapter == (None if req.role == "answer" else req.role)
        assert comp.prompt_tokens > 10 and 0 < comp.completion_tokens <= 12
        assert comp.finish_reason in ("stop", "length") and comp.constrained is False


def test_one_backend_call_per_batch(hf_tiny_qwen3, routes, tmp_path):
    calls = []

    class Counting:
        def generate(self, requests, routes=None):
            calls.append(len(requests))
            return hf_tiny_qwen3.generate(requests, routes)

    router = Router(routes, backends={"hf": Counting()})
    reqs = [
        ChatRequest(role=r, messages=_msgs(q), question_id=f"q{i}")
        for i, q in enumerate(QUESTIONS)
        for r in ("proposer", "writer")
    ]
    out = router.generate(reqs)
    assert calls == [6]
    assert [c.role for c in out] == [q.role for q in reqs]  # completions come back in request order, role-tagged
    assert all(c.prompt_tokens > 0 and c.completion_tokens > 0 for c in out)


def test_thinking_is_split_and_chat_template_kwargs_apply(hf_tiny_qwen3, tiny_qwen3):
    from maps_train.llm.call_spec import call_spec
    from maps_train.llm.rendering import prompt_token_ids
    from maps_train.llm.thinking import split_thinking

    assert split_thinking("<think>\nplan\n</think>\n\nParis") == ("Paris", "plan")
    assert split_thinking("plan</think>Paris") == ("Paris", "plan")
    assert split_thinking("<think>cut off") == ("", "cut off")
    assert split_thinking("Paris") == ("Paris", None)
    req = ChatRequest(role="r", messages=_msgs("hi"))
    tok = hf_tiny_qwen3.tokenizer
    off = tok.decode(prompt_token_ids(tok, call_spec(req, RoleRoute(enable_thinking=False))))
    on = tok.decode(prompt_token_ids(tok, call_spec(req, RoleRoute(enable_thinking=True))))
    assert "<think>" in off and "<think>" not in on  # the template pre-closes an empty think block when off
    forced = ChatRequest(role="r", messages=_msgs("hi"), chat_template_kwargs={"enable_thinking": True})
    assert tok.decode(prompt_token_ids(tok, call_spec(forced, RoleRoute(enable_thinking=False)))) == on


def test_truncation_policies(hf_tiny_qwen3, tiny_qwen3):
    long = _msgs("word " * 400)
    route = RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=8)
    from maps_train.recipe import BackendConfig

    hf_tiny_qwen3.config = BackendConfig(dtype="float32", max_model_len=1024, truncate_prompt="error")
    saved = hf_tiny_qwen3.max_model_len
    hf_tiny_qwen3.max_model_len = 128
    try:
        with pytest.raises(MapsTrainError, match="truncate_prompt=error.*over max_model_len 128") as err:
            hf_tiny_qwen3.generate([ChatRequest(role="writer", messages=long)], [route])
        assert "\n" not in str(err.value)
        hf_tiny_qwen3.config.truncate_prompt = "left"
        (comp,) = hf_tiny_qwen3.generate([ChatRequest(role="writer", messages=long)], [route])
        assert comp.prompt_tokens == 120 and comp.completion_tokens <= 8
    finally:
        hf_tiny_qwen3.max_model_len = saved
        hf_tiny_qwen3.config.truncate_prompt = "shrink"


def test_bad_routes_are_one_line_errors(tiny_qwen3, tmp_path):
    router = Router({"writer": RoleRoute(backend="hf", model=tiny_qwen3)}, backends={})
    with pytest.raises(MapsTrainError, match="roles.proposer: no route for role 'proposer'"):
        router.generate([ChatRequest(role="proposer", messages=_msgs("x"))])
    recipe = Recipe(roles={"writer": RoleRoute(backend="hf", model=tiny_qwen3, adapter=str(tmp_path / "nope"))})
    with pytest.raises(MapsTrainError, match="roles.writer.adapter: .*not a LoRA adapter folder"):
        build_router(recipe)


def test_build_router_is_lazy_and_shares_one_engine(tiny_qwen3, qwen_adapters, tmp_path):
    recipe = Recipe(
        roles={
            "default": RoleRoute(backend="hf", model=tiny_qwen3, max_tokens=4),
            "proposer": RoleRoute(backend="hf", model=tiny_qwen3, adapter=qwen_adapters["proposer"], max_tokens=4),
        }
    )
    router = build_router(recipe)
    assert router._built == {}
    out = router.generate(
        [
            ChatRequest(role="proposer", messages=_msgs("a"), question_id="q"),
            ChatRequest(role="answer", messages=_msgs("b"), question_id="q"),
        ]
    )
    assert set(router._built) == {f"hf:{tiny_qwen3}"} and [c.adapter for c in out] == ["proposer", None]
    router.close()
    assert router._built == {}


def test_chat_command(tmp_path):
    from typer.testing import CliRunner

    from maps_train.cli import app

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "roles:\n  default:\n    backend: hf\n    model: builtin:tiny-qwen3\n    max_tokens: 5\n"
        "backend:\n  dtype: float32\n"
    )
    result = CliRunner().invoke(app, ["chat", str(recipe), "--role", "writer", "hello"])
    assert result.exit_code == 0, result.output
    assert "5 completion tokens" in result.output and "finish=length" in result.output
    bad = CliRunner().invoke(app, ["chat", str(recipe), "hello", "--set", "roles.default.adapter=/nope"])
    assert isinstance(bad.exception, MapsTrainError) and "roles.default.adapter" in str(bad.exception)
