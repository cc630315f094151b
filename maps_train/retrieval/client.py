"""`RetrievalClient`: the `Retriever` interface over HTTP, for a running `maps-train retrieve serve`."""

from __future__ import annotations

import time

from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Hit


class RetrievalClient:
    """`search(queries, k)` against `url`; safe to share between threads (one pooled httpx.Client)."""

    def __init__(self, url: str, timeout_s: float = 60.0, retries: int = 2):
        import httpx

        self.url = url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)))

    def _request(self, method: str, path: str, **kwargs):
        import httpx

        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TimeoutException as err:
                error = MapsTrainError(f"retrieval service {self.url}{path}: timed out ({type(err).__name__})")
            except httpx.TransportError as err:
                error = MapsTrainError(
                    f"retrieval service {self.url} unreachable ({type(err).__name__}: {err}); "
                    f"start it with `maps-train retrieve serve --index DIR` or unset retrieval.service_url"
                )
            else:
                if response.status_code >= 500 and attempt < self.retries:
                    error = None
                elif response.is_error:
                    detail = response.text[:300].replace("\n", " ")
                    raise MapsTrainError(f"retrieval service {self.url}{path}: HTTP {response.status_code}: {detail}")
                else:
                    return response.json()
            if attempt < self.retries:
                time.sleep(0.5 * 2**attempt)
        if error is None:
            raise MapsTrainError(f"retrieval service {self.url}{path}: HTTP {response.status_code}")
        raise error

    def health(self) -> dict:
        return self._request("GET", "/health")

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        body = self._request("POST", "/search", json={"queries": list(queries), "k": int(k)})
        return [[Hit(**hit) for hit in hits] for hits in body["hits"]]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
