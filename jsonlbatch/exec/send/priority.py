"""`--priority N` and a request line's `priority`: one meaning for users, each server's own field.

For users, a higher priority is more important: a batch that should yield to live traffic
(priority 0, the servers' default) runs at `--priority -1` or lower. Servers that schedule by
priority read a `priority` integer in the request body, in opposite directions:

- vLLM (launched with `--scheduling-policy priority`): lower values are served first, so it
  gets `-N`;
- SGLang (launched with `--enable-priority-scheduling`): higher values first by default, so it
  gets `N`.

Which server an endpoint is comes from its `/metrics` (`vllm:` or `sglang:` names, read before
the run). An endpoint that is neither, as far as they tell, gets no `priority` field: a hosted
API would refuse an unknown field. A `priority` already in a body is the user's own, in the
server's terms, and is left alone.
"""

from __future__ import annotations

from typing import Any

import orjson

#: What a user's priority is multiplied by for each kind of server.
SIGNS = {"vllm": -1, "sglang": 1}


def sign_of(kind: str | None) -> int:
    """-1 (vLLM), 1 (SGLang) or 0 (unknown: the priority is not sent)."""
    return SIGNS.get(kind or "", 0)


class Payloads:
    """One request's encoded body per kind of server (the priority differs by sign)."""

    __slots__ = ("_body", "_by_sign", "_priority")

    def __init__(self, body: dict[str, Any], priority: int | None) -> None:
        self._body = body
        self._priority = None if priority is None or "priority" in body else priority
        self._by_sign: dict[int, bytes] = {}

    def for_sign(self, sign: int) -> bytes:
        """The body to send to a server of this sign (encoded once per sign)."""
        priority = self._priority
        key = sign if priority is not None else 0
        payload = self._by_sign.get(key)
        if payload is None:
            body = (
                self._body
                if priority is None or key == 0
                else {**self._body, "priority": key * priority}
            )
            payload = self._by_sign[key] = orjson.dumps(body)
        return payload
