"""Continuous client load for tests of a fleet that changes under it.

    with StreamLoad(fleet.client(), "tiny", num_streams=4) as load:
        ... scale, apply, kill ...
    load.failures        every exception a request raised (must be empty for a planned change)
    load.stream_failures / load.plain_failures   the same, by kind of request
    load.completed       requests that ended normally
    load.unfinished      streams that ended without a finish reason (cut)

Each of ``num_streams`` threads sends requests one after another until the block ends:
streamed and not, in turn, ``max_tokens`` long with ``ignore_eos`` so that every stream
runs its full length. A stream counts as finished only when its last chunk carries a
finish reason, which the openai client sees only after vLLM's ``[DONE]``.
"""

from __future__ import annotations

import threading
from typing import Any


class StreamLoad:
    def __init__(self, client: Any, model: str, num_streams: int = 4, max_tokens: int = 64):
        self.client = client
        self.model = model
        self.num_streams = num_streams
        self.max_tokens = max_tokens
        self.failures: list[BaseException] = []
        self.stream_failures: list[BaseException] = []
        self.plain_failures: list[BaseException] = []
        self.completed = 0
        self.unfinished = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(num_streams)
        ]

    def __enter__(self) -> StreamLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=300)

    def _loop(self, index: int) -> None:
        stream = index % 2 == 0
        while not self._stop.is_set():
            try:
                finished = self._one(stream)
            except Exception as exc:
                with self._lock:
                    self.failures.append(exc)
                    (self.stream_failures if stream else self.plain_failures).append(exc)
            else:
                with self._lock:
                    self.completed += finished
                    self.unfinished += not finished
            stream = not stream

    def _one(self, stream: bool) -> bool:
        args = {
            "model": self.model,
            "prompt": "Tell me a long story about",
            "max_tokens": self.max_tokens,
            "extra_body": {"ignore_eos": True},
        }
        if not stream:
            response = self.client.completions.create(**args)
            return bool(response.choices[0].finish_reason == "length")
        reason = None
        for chunk in self.client.completions.create(stream=True, **args):
            if chunk.choices and chunk.choices[0].finish_reason:
                reason = chunk.choices[0].finish_reason
        return reason == "length"
