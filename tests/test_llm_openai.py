"""The OpenAI-compatible backend without a server: bounded retries end in one line, never a hang.
(Against a real `vllm serve`, see test_llm_vllm.py.)"""

from __future__ import annotations

import time

import pytest

from maps_train.errors import MapsTrainError
from maps_train.llm import ChatRequest
from maps_train.llm.openai_backend import OpenAIBackend
from maps_train.llm.router import build_router
from maps_train.platform import free_port
from maps_train.recipe import BackendConfig, Recipe, RoleRoute


def test_unreachable_server_fails_after_bounded_retries():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    recipe = Recipe(
        # truncate_prompt=left: no tokenizer to load here (tens of seconds on a busy machine, not the retries')
        backend=BackendConfig(base_urls=[url], max_retries=2, request_timeout_s=2, truncate_prompt="left"),
        roles={"default": RoleRoute(backend="openai", adapter="writer")},
    )
    router = build_router(recipe)
    start = time.perf_counter()
    with pytest.raises(MapsTrainError, match=r"backend.base_urls: .* failed 3 times \(APIConnectionError") as err:
        router.generate([ChatRequest(role="writer", messages=[{"role": "user", "content": "hi"}])] * 3)
    assert "\n" not in str(err.value)
    assert time.perf_counter() - start < 30
    router.close()


def test_requests_spread_least_loaded_round_robin():
    backend = OpenAIBackend(BackendConfig(base_urls=["http://a/v1", "http://b/v1", "http://c/v1"]))
    try:
        picks = [backend._pick_url() for _ in range(6)]
        assert sorted(picks) == sorted(backend.urls * 2)
        backend.in_flight["http://a/v1"] = 3
        backend.in_flight["http://b/v1"] = 1
        assert {backend._pick_url() for _ in range(4)} == {"http://c/v1"}
    finally:
        backend.close()


def test_empty_url_list_is_a_config_error():
    with pytest.raises(MapsTrainError, match="backend.base_urls: empty"):
        OpenAIBackend(BackendConfig(base_urls=[]))


def test_server_wait_gives_a_starting_server_time_then_one_line():
    """`backend.server_wait_s`: the first request waits for /health (here nothing ever answers) up to the wait,
    then fails in one line naming the setting, without spending the retries on a server that is still starting."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    recipe = Recipe(
        backend=BackendConfig(base_urls=[url], server_wait_s=2.0, max_retries=0, request_timeout_s=2,
                              truncate_prompt="left"),
        roles={"default": RoleRoute(backend="openai", adapter="writer")},
    )
    router = build_router(recipe)
    start = time.perf_counter()
    with pytest.raises(MapsTrainError, match=r"backend.server_wait_s: http://127.0.0.1:\d+/health did not answer "
                                             r"within 2s") as err:
        router.generate([ChatRequest(role="writer", messages=[{"role": "user", "content": "hi"}])])
    assert "\n" not in str(err.value)
    assert 2.0 <= time.perf_counter() - start < 30  # it did wait
    router.close()
