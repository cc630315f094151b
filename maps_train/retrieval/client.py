"""`RetrievalClient`: the `Retriever` interface over HTTP, for a running `maps-train retrieve serve`."""

from __future__ import annotations

import time

from maps_train.config.redaction import redact_text
from maps_train.errors import MapsTrainError
from maps_train.retrieval.base import Hit
from maps_train.safejson import scrub


def _refusal(response) -> str:
    """The service's one-line `detail` (its JSON error body), with what the status means for the caller."""
    try:
        detail = response.json()["detail"]
    except (ValueError, KeyError, TypeError):
        detail = response.text
    if not isinstance(detail, str):
        detail = str(detail)
    detail = " ".join(detail.split())[:300]
    meaning = {
        413: "the request is over a service limit (split the queries, lower k, or raise the limit on `retrieve serve`)",
        422: "the service refused a malformed request",
    }.get(response.status_code)
    return f"HTTP {response.status_code}: {detail}" + (f"; {meaning}" if meaning else "")


class RetrievalClient:
    """`search(queries, k)` against `url`; safe to share between threads (one pooled httpx.Client)."""

    def __init__(self, url: str, timeout_s: float = 60.0, retries: int = 2):
        import httpx

        self.url = url.rstrip("/")
        self.shown_url = redact_text(self.url)  # what error lines show: no user info
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)))

    def _request(self, method: str, path: str, **kwargs):
        """One call, retried `retries` times after a 5xx, a timeout or a transport error (0.5 s, 1 s, ... between);
        a 4xx or the last failure is one MapsTrainError line."""
        import httpx

        # Retried here, not by httpx's `HTTPTransport(retries=N)`: that retries only a failed connect (httpcore's
        # ConnectError/ConnectTimeout), never the 5xx or the read timeout that a busy service gives.
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TimeoutException as err:
                error = MapsTrainError(f"retrieval service {self.shown_url}{path}: timed out ({type(err).__name__})")
            except httpx.RemoteProtocolError as err:  # the service streams its answer; a cut one ends like this
                error = MapsTrainError(
                    f"retrieval service {self.shown_url}{path}: the answer was cut off ({redact_text(str(err))}); "
                    "the service's log says why (a search that failed, or an answer not read within --send-timeout-s)"
                )
            except httpx.TransportError as err:
                error = MapsTrainError(
                    f"retrieval service {self.shown_url} unreachable ({type(err).__name__}: {redact_text(str(err))}); "
                    f"start it with `maps-train retrieve serve --index DIR` or unset retrieval.service_url"
                )
            else:
                if response.status_code >= 500 and attempt < self.retries:
                    error = None
                elif response.is_error:  # 4xx (413 over a limit, 422 malformed) would fail again: no retry
                    raise MapsTrainError(f"retrieval service {self.shown_url}{path}: {_refusal(response)}")
                else:
                    return response.json()
            if attempt < self.retries:
                time.sleep(0.5 * 2**attempt)
        if error is None:
            raise MapsTrainError(f"retrieval service {self.shown_url}{path}: {_refusal(response)}")
        raise error

    def health(self) -> dict:
        return self._request("GET", "/health")

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        # a lone surrogate (from a model's JSON) cannot be sent as UTF-8: it becomes U+FFFD, as in every record
        body = self._request("POST", "/search", json={"queries": [scrub(query) for query in queries], "k": int(k)})
        return [[Hit(**hit) for hit in hits] for hits in body["hits"]]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
