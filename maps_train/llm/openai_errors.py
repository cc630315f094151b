"""The OpenAI backend's failures as one MapsTrainError line each: what the SDK gave up on after its retries (and
how many attempts it made), a refusal, a request given up as stalled, a stream broken off."""

from __future__ import annotations

from typing import Any

from maps_train.config.redaction import redact_text
from maps_train.errors import MapsTrainError
from maps_train.llm.openai_stream import Stalled


def one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _transient(status: int) -> bool:
    """A status the SDK retries (`_should_retry`: timeout, conflict, rate limit, server error)."""
    return status in (408, 409, 429) or status >= 500


def _failed(url: str, what: str, err: Any) -> str:
    """The line for an error the SDK gave up on. Its attempts are read off the last request it sent (the SDK's
    own `x-stainless-retry-count` header), not assumed: a `Retry-After` over its cap stops retries early."""
    attempts = int(err.request.headers.get("x-stainless-retry-count", 0)) + 1
    return redact_text(f"backend.base_urls: {url} failed {attempts} times ({type(err).__name__}: {one_line(err)}) "
                       f"on {what}")


async def answered(url: str, what: str, call):
    """`call()` through the SDK, which has retried what may pass on a retry; its final error becomes one
    MapsTrainError line that says how many attempts the SDK made."""
    import openai

    try:
        return await call()
    except openai.APIConnectionError as err:  # timeouts included (APITimeoutError)
        raise MapsTrainError(_failed(url, what, err)) from None
    except openai.NotFoundError as err:
        raise MapsTrainError(redact_text(f"backend.base_urls: {url} has no model for {what} ({one_line(err)})")
                             ) from None
    except openai.APIStatusError as err:
        if _transient(err.status_code):
            raise MapsTrainError(_failed(url, what, err)) from None
        raise MapsTrainError(
            redact_text(f"backend.base_urls: {url} refused {what} (HTTP {err.status_code}: {one_line(err)})")
        ) from None
    except Stalled as err:
        raise MapsTrainError(redact_text(f"backend.base_urls: {url} stalled on {what}: {err}")) from None
    except openai.APIError as err:  # an error event mid-stream (a broken connection is an APIConnectionError)
        raise MapsTrainError(redact_text(f"backend.base_urls: {url} broke off {what} mid-stream "
                                         f"({type(err).__name__}: {one_line(err)})")) from None
