"""Read a streamed (SSE) answer and rebuild the body the same request gets without streaming.

Streaming is for measuring (time to first token, inter-token gaps), not for changing outputs:
`exec --stream` writes the `chat.completion` (or `text_completion`) body a non-streamed request
would have got, so every downstream tool reads the same shape either way.

`StreamReader.feed(bytes, now)` takes raw network reads (cut anywhere, even inside a line or a
UTF-8 character) with the time they arrived; `body_caps.read_stream` drives it from an aiohttp
response, within the caps on what one answer may hold.
Lines are split here rather than by aiohttp's `readline`, which is slower and raises
`LineTooLong` on long lines (big tool-call arguments, long reasoning chunks).

Timing follows the vLLM and SGLang serving benchmarks: TTFT is start to the first event that
carries content, reasoning or a tool call; ITL are the gaps between later such events (events
that arrive in one network read share its time); TPOT is `(E2EL - TTFT) / (completion_tokens
- 1)` with tokens from the usage chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from jsonlbatch.batch_format.answers import usage_metrics
from jsonlbatch.batch_format.records import CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, RESPONSES_URL
from jsonlbatch.errors import JsonlbatchError
from jsonlbatch.exec.send.stream_choices import ChoiceDeltas
from jsonlbatch.redact import redact
from jsonlbatch.stats import percentile

#: Endpoints whose requests `exec --stream` sends with `stream: true`.
STREAM_URLS = frozenset({CHAT_URL, COMPLETIONS_URL})
#: Endpoints whose streams exec cannot read yet (typed `event:` streams): refused up front.
NO_STREAM_URLS = frozenset({RESPONSES_URL, MESSAGES_URL})

_DONE = b"[DONE]"
_ITL_PERCENTILES = (("itl_p50_s", 50), ("itl_p90_s", 90), ("itl_p99_s", 99))
_SNIPPET = 200  # characters of a bad event quoted in an error message


class StreamError(JsonlbatchError):
    """An answer that broke after its status line: worth a retry, unless it is too large.

    `code` is the response line's `error.code`: `stream_error` when the server said something
    was wrong, `connection_error` when the stream just stopped, `response_too_large` and
    `stream_stalled` when a cap in `body_caps.py` stopped it.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def stream_body(body: dict[str, Any]) -> dict[str, Any]:
    """Ask for a stream with usage in its last chunk, keeping any other stream options."""
    options = body.get("stream_options")
    body["stream"] = True
    body["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return body


class StreamReader:
    """Rebuilds one streamed answer from raw bytes and times it.

    Feed every network read with `feed(data, now)`, then call `close(now)`; `body()` and
    `metrics(start, end)` give the result. Raises `StreamError` on an error event, a bad event,
    or (at `close`) a stream that ended before `[DONE]`.
    """

    def __init__(self, *, chat: bool = True) -> None:
        self.chat = chat
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.chunks = 0  # events that carried content, reasoning or a tool call
        self.first: float | None = None  # arrival of the first such event
        self.gaps: list[float] = []  # between such events, after the first (`metrics` sorts)
        self._last = 0.0
        self._head: dict[str, Any] | None = None
        self._fingerprint: Any = None  # vLLM sends it on the usage chunk only, OpenAI on each
        self._choices: dict[int, ChoiceDeltas] = {}
        self._pieces: list[bytes] = []  # an event not yet ended
        self._data: bytes | None = None  # data lines of the event not yet dispatched
        self._event: bytes | None = None
        self._cr = False

    # -- bytes to events ------------------------------------------------------------------------

    def feed(self, data: bytes, now: float) -> None:
        """Take one network read that arrived at `now` (seconds on any monotonic clock)."""
        if self._cr:  # the last read ended in CR: a LF now is the second half of a CRLF
            self._cr = False
            if data[:1] == b"\n":
                data = data[1:]
        if b"\n" not in data and b"\r" not in data:
            if data:
                self._pieces.append(data)
            return
        if self._pieces:
            self._pieces.append(data)
            data = b"".join(self._pieces)
            self._pieces.clear()
        if b"\r" in data:  # SSE allows CRLF and CR line ends too
            self._cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n\n") + 2  # an event ends at a blank line
        if end == 1:
            self._pieces.append(data)
            return
        if end < len(data):
            self._pieces.append(data[end:])
        if not self._batch(data if end == len(data) else data[:end], now):
            for block in data[: end - 2].split(b"\n\n"):
                if block.startswith(b"data: ") and b"\n" not in block:  # a one-line event
                    self._dispatch(block[6:], now)
                elif block:
                    self._lines(block, now)

    def _batch(self, events: bytes, now: float) -> bool:
        """The fast path: whole events that are all one `data: {...}` line each, parsed with a
        single orjson call as one JSON array. False (nothing done) for anything else: fields,
        comments but leading ones, several data lines, bad JSON; the general path takes those.

        Exact because JSON text holds no raw newline: once every `\\n\\ndata: {` boundary is
        turned into a comma, a newline left means the read holds something else; and as every
        event then starts an object, as many values as events means one object per event.
        """
        if self.done:
            return False
        start, stop = 0, len(events) - 2  # offsets, not slices: reads can be large
        while events.startswith(b":", start):  # comments alone (a server's ping) are skipped
            line_end = events.find(b"\n", start)
            if line_end != events.find(b"\n\n", start):
                return False
            start = line_end + 2
        done = events.endswith(b"data: [DONE]\n\n")
        if done:
            stop -= 14
        if start >= stop:
            self.done = done
            return True
        if not events.startswith(b"data: {", start):
            return False
        body = events[start + 6 : stop]
        joined = body.replace(b"\n\ndata: {", b",{")
        if b"\n" in joined:  # a newline that is not an event boundary: fields, comments, ...
            return False
        try:
            chunks = orjson.loads(b"[%s]" % joined)
        except orjson.JSONDecodeError:
            return False
        if len(chunks) != (len(body) - len(joined)) // 7 + 1:  # `data: {...},{...}`
            return False  # every event starts an object, so this is one object per event
        self._take(chunks, now)
        self.done = done
        return True

    def close(self, now: float) -> None:
        """The stream ended: take what is left and check that it ended properly."""
        if self._pieces:
            self._lines(b"".join(self._pieces), now)  # a last event without its blank line
            self._pieces.clear()
        if self.done:
            return
        choices = self._choices.values()
        if choices and all(c.finish_reason is not None for c in choices):
            return  # a server that never says [DONE] but finished every choice
        raise StreamError("connection_error", "the stream ended before [DONE]")

    def _lines(self, block: bytes, now: float) -> None:
        """One event's lines, the general way: fields, comments, several data lines."""
        for line in block.split(b"\n"):
            self._line(line, now)
        self._line(b"", now)

    def _line(self, line: bytes, now: float) -> None:
        if not line:
            if self._data is not None:
                data, self._data = self._data, None
                self._dispatch(data, now)
            self._event = None
            return
        if line.startswith(b"data:"):
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._data = value if self._data is None else self._data + b"\n" + value
        elif line.startswith(b"event:"):
            self._event = line[6:].strip()
        # comments (":"), "id:", "retry:" and unknown fields are ignored, as the SSE spec says

    # -- events to the answer -------------------------------------------------------------------

    def _dispatch(self, data: bytes, now: float) -> None:
        event, self._event = self._event, None
        if self.done:
            return
        if data == _DONE:
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise StreamError(
                "stream_error", f"bad JSON in a stream event: {_snippet(data)}"
            ) from None
        if chunk.__class__ is not dict:
            raise StreamError("stream_error", f"a stream event is not an object: {_snippet(data)}")
        if event == b"error":
            raise StreamError("stream_error", "error event in the stream: " + _error_text(chunk))
        self._take((chunk,), now)

    def _take(self, chunks: Sequence[dict[str, Any]], now: float) -> None:
        """Decoded chunks that arrived together at `now`."""
        carried = 0
        merge = self._merge
        for chunk in chunks:
            choices = chunk.get("choices")
            if not choices and (chunk.get("error") is not None or chunk.get("object") == "error"):
                raise StreamError(
                    "stream_error", "error event in the stream: " + _error_text(chunk)
                )
            usage = chunk.get("usage")
            if usage:
                self.usage = usage
                if self._fingerprint is None:
                    self._fingerprint = chunk.get("system_fingerprint")
            if choices.__class__ is list and merge(choices):
                carried += 1
        if self._head is None and chunks:
            self._head = chunks[0]
        if carried:  # the first gap is since the last read; chunks within one read share `now`
            self.chunks += carried
            if self.first is None:
                self.first = now
            else:
                self.gaps.append(now - self._last)
            if carried > 1:
                self.gaps.extend([0.0] * (carried - 1))
            self._last = now

    def _merge(self, choices: list[Any]) -> bool:
        """Merge the choices of one chunk; whether any carried generated output.

        The hot loop of streaming (once per token): kept flat, without helper calls.
        """
        carried = False
        states = self._choices
        chat = self.chat
        for raw in choices:
            if raw.__class__ is not dict:
                continue
            index = raw.get("index", 0)
            if not isinstance(index, int):
                index = 0  # a malformed index (a list, a string): the first choice
            choice = states.get(index)
            if choice is None:
                choice = states[index] = ChoiceDeltas(index)
            if chat:
                delta = raw.get("delta")
                if delta.__class__ is dict:
                    for key, value in delta.items():
                        if value.__class__ is str:
                            if key == "role":
                                choice.role = value
                                continue
                            # content, reasoning, reasoning_content, refusal: under their name
                            parts = choice.texts.get(key)
                            if parts is None:
                                choice.texts[key] = [value]
                            else:
                                parts.append(value)
                            if value:
                                carried = True
                        elif value and key == "tool_calls" and value.__class__ is list:
                            choice.add_tool_calls(value)
                            carried = True
                        elif key == "function_call" and isinstance(value, dict):
                            choice.add_function_call(value)
                            carried = True
            else:
                text = raw.get("text")
                if text.__class__ is str:
                    choice.add_text("text", text)
                    if text:
                        carried = True
            finish = raw.get("finish_reason")
            if finish is not None:
                choice.finish_reason = finish
            if raw.get("logprobs") is not None:
                choice.add_logprobs(raw["logprobs"])
            if raw.get("stop_reason") is not None:
                choice.stop_reason = raw["stop_reason"]
        return carried

    # -- results --------------------------------------------------------------------------------

    def body(self) -> dict[str, Any]:
        """The non-streamed shape: `chat.completion` or `text_completion`, choices by index."""
        head = self._head or {}
        choices = [self._choices[i] for i in sorted(self._choices)]
        out: dict[str, Any] = {
            "id": head.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
        }
        fingerprint = head.get("system_fingerprint")
        if fingerprint is None:
            fingerprint = self._fingerprint
        if fingerprint is not None:
            out["system_fingerprint"] = fingerprint
        out["choices"] = [c.chat_choice() if self.chat else c.text_choice() for c in choices]
        out["usage"] = self.usage
        return out

    def metrics(self, start: float, end: float) -> dict[str, Any]:
        """Token counts and timings for the response line's `metrics` (`latency_s` = end - start
        is the caller's). Times are on the clock `feed` was given."""
        out: dict[str, Any] = usage_metrics(
            CHAT_URL if self.chat else COMPLETIONS_URL, {"usage": self.usage}
        )
        completion = out.get("completion_tokens")
        if self.first is not None:
            ttft = self.first - start
            out["ttft_s"] = round(ttft, 6)
            if isinstance(completion, (int, float)) and completion > 1:
                out["tpot_s"] = round((end - start - ttft) / (completion - 1), 6)
        gaps = self.gaps
        if gaps:
            gaps.sort()
            out["itl_mean_s"] = round(sum(gaps) / len(gaps), 6)
            for key, p in _ITL_PERCENTILES:
                out[key] = round(percentile(gaps, p), 6)
            out["itl_max_s"] = round(gaps[-1], 6)
        out["chunks"] = self.chunks
        return out


def _error_text(chunk: dict[str, Any]) -> str:
    error = chunk.get("error", chunk)
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or error
        code = error.get("code")
        return f"{message} (code {code})" if code is not None else str(message)
    return str(error)


def _snippet(data: bytes) -> str:
    """The start of an event for a message: masked before it is cut (`redact`), so a key at
    the cut cannot leave its head behind (the slice leaves room for any key across it)."""
    return repr(redact(data[: _SNIPPET + 4096].decode("utf-8", "replace"), limit=_SNIPPET))
