"""A minimal OpenAI-compatible chat client (`POST {endpoint}/chat/completions`), standard library only.

Transient failures (connection errors, time-outs, HTTP 408, 409, 425, 429 and 5xx, a reply that is not JSON) are
retried with exponential back-off: attempt k (from 0) waits `backoff · 2^k` seconds (at most `max_backoff`, plus up to
10% jitter), or the server's `Retry-After` when it sends one. Other HTTP errors (400, 401, 403, 404, ...) are not
retried: they will not go away by asking again.
"""

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from ..record_fields import RecordError
from .records import ChatReply


RETRY_STATUSES = frozenset({408, 409, 425, 429})


class JudgeRequestError(RuntimeError):
    """A chat request that failed for good (a non-retryable HTTP error, or every retry used)."""


@dataclass
class ChatClient:
    """Sends chat requests to one endpoint and model.

    Args:
        endpoint (`str`): the API base URL, e.g. `https://api.openai.com/v1` (`/chat/completions` is appended).
        model (`str`): the `model` of every request.
        api_key (`str`, *optional*): sent as `Authorization: Bearer ...` (never stored anywhere).
        options (`dict`): further request fields (`temperature`, `max_tokens`, provider-specific ones).
        timeout (`float`): seconds one HTTP request may take.
        retries (`int`): retries after the first attempt.
        backoff, max_backoff (`float`): back-off schedule in seconds (module docstring).
        sleep: the waiting function (tests pass one that does not wait).
    """

    endpoint: str
    model: str
    api_key: str | None = None
    options: dict = field(default_factory=dict)
    timeout: float = 600.0
    retries: int = 6
    backoff: float = 2.0
    max_backoff: float = 120.0
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self):
        self._jitter = random.Random()  # a private stream: the global RNG stays untouched

    @property
    def url(self) -> str:
        return self.endpoint.rstrip("/") + "/chat/completions"

    def body(self, messages: list[dict]) -> dict:
        """The JSON body of a request (also the cache key's content)."""
        return {"model": self.model, "messages": messages, **self.options}

    def _wait(self, attempt: int, retry_after: str | None) -> None:
        try:
            delay = float(retry_after) if retry_after is not None else None
        except ValueError:
            delay = None
        if delay is None:
            delay = min(self.backoff * 2**attempt, self.max_backoff) * (1 + 0.1 * self._jitter.random())
        self.sleep(delay)

    def _post(self, data: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.loads(response.read().decode("utf-8"))

    def complete(self, messages: list[dict]) -> ChatReply:
        """Sends one chat request, retrying transient failures; raises [`JudgeRequestError`] when it cannot."""
        data = json.dumps(self.body(messages)).encode("utf-8")
        last = ""
        for attempt in range(self.retries + 1):
            retry_after = None
            try:
                return ChatReply.from_json(self._post(data), self.url)
            except urllib.error.HTTPError as error:
                detail = error.read().decode("utf-8", "replace")[:500]
                last = f"HTTP {error.code} from {self.url}: {detail}"
                if error.code not in RETRY_STATUSES and error.code < 500:
                    raise JudgeRequestError(last) from error
                retry_after = error.headers.get("Retry-After") if error.headers else None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as error:
                last = f"cannot reach {self.url}: {error}"
            except (json.JSONDecodeError, UnicodeDecodeError, RecordError, KeyError, IndexError, TypeError) as error:
                last = f"{self.url} sent a reply that is not a chat completion ({type(error).__name__}: {error})"
            if attempt < self.retries:
                self._wait(attempt, retry_after)
        raise JudgeRequestError(f"{last} (gave up after {self.retries + 1} attempts)")
