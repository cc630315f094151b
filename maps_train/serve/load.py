"""Load trained role adapters into a running server (one started with `maps-train serve --adapters-later`).

vLLM's runtime adapter loading (`POST /v1/load_lora_adapter`, on when the server's environment has
VLLM_ALLOW_RUNTIME_LORA_UPDATING) goes through the same loader as `--lora-modules` at start-up; the adapters are
checked here first exactly as `plan_server` checks them (vLLM's rules, same base). An adapter the server already
serves from the same folder is left as it is; one served from another folder is an error. vLLM does not drop
cached prefixes computed with an adapter's old weights, so an adapter retrained since it was loaded needs a
server restart.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from maps_train.adapters import AdapterSet, distilled_set
from maps_train.errors import MapsTrainError
from maps_train.serve.plan import RUNTIME_LORA_ENV, check_adapters


def served_adapters(url: str, timeout_s: float = 30.0) -> dict[str, str]:
    """Adapter name -> folder, as the server at `url` (…/v1) lists them in /v1/models (cards with a parent)."""
    try:
        response = httpx.get(f"{url}/models", timeout=timeout_s)
        response.raise_for_status()
        cards = response.json().get("data", [])
    except (httpx.HTTPError, ValueError) as err:
        raise MapsTrainError(f"{url}/models: {err}") from None
    return {card["id"]: str(card.get("root")) for card in cards if card.get("parent")}


def _refusal(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or f"HTTP {response.status_code}"
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else (body.get("message") if isinstance(body, dict) else None)
    return " ".join(str(message or body).split())[:300]


def load_adapters(recipe, url: str | None = None, timeout_s: float = 300.0, echo=print,
                  adapter_set: AdapterSet | None = None) -> dict[str, str]:
    """Load every adapter with weights of `adapter_set` (default: the recipe's distilled set) into the server at
    `url` (default: the recipe's serve host and port); returns name -> folder of what it serves now."""
    _, adapters, _ = check_adapters(recipe, adapter_set if adapter_set is not None else distilled_set(recipe))
    url = (url or f"http://{recipe.serve.host}:{recipe.serve.port}/v1").rstrip("/")
    present = served_adapters(url)
    for name, folder in adapters.items():
        path = str(Path(folder).resolve())
        if name in present:
            if Path(present[name]).resolve() != Path(path):
                raise MapsTrainError(f"adapter '{name}': {url} already serves it from {present[name]}; restart the "
                                     f"server to serve {path}")
            echo(f"{name}: already served from {path}")
            continue
        try:
            response = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": name, "lora_path": path},
                                  timeout=timeout_s)
        except httpx.HTTPError as err:
            raise MapsTrainError(f"{url}/load_lora_adapter: {err}") from None
        if response.status_code == 404:
            raise MapsTrainError(f"{url}: the server does not load adapters at run time (start it with `maps-train "
                                 f"serve RECIPE --adapters-later`, which sets {RUNTIME_LORA_ENV})")
        if response.status_code != 200:
            raise MapsTrainError(f"adapter '{name}' ({path}): {url} refused it: {_refusal(response)}")
        echo(f"{name}: loaded from {path}")
    served = served_adapters(url)
    missing = sorted(set(adapters) - set(served))
    if missing:
        raise MapsTrainError(f"{url}: loaded, but /v1/models does not list {', '.join(missing)}")
    return {name: served[name] for name in adapters}
