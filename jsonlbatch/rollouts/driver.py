"""The rollout driver: conversations as a request source of exec's run loop.

Each conversation is a task: it makes its turn's request, hands it to the run (the same
queue, workers, scheduler, checks and recorder as any exec request; `exec/hooks/
request_source.py`) and waits for its result alone, so its next turn goes as soon as its own
tools have run: no barrier between conversations. An `ask` by a tool is one more request of
the same run. A call the calls file already answers (a resume) is read back instead of sent;
a tool result the journal holds is reused (or, with `new_state`, replayed against a fresh
state and checked), so a resumed conversation ends as an uninterrupted one does.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson

from jsonlbatch.batch_format.call_ids import call_id, companions
from jsonlbatch.batch_format.idset import IdSet
from jsonlbatch.batch_format.records import CHAT_URL, Request, Result, check_request, fingerprint
from jsonlbatch.errors import MAX_PROBLEMS, InputError, Problem, problems_text
from jsonlbatch.exec.prepare.input_scan import NO_FINGERPRINT, InputScan, OutputScan, edited
from jsonlbatch.file_io.jsonl import iter_lines_at
from jsonlbatch.rollouts import context
from jsonlbatch.rollouts.context import AskAnswer, AskFailed, Conversation, Diverged
from jsonlbatch.rollouts.journal import Journal, ResumeIndex, finished_ids
from jsonlbatch.rollouts.rollout_summary import RolloutSummary, Tally
from jsonlbatch.rollouts.tools import (
    HookFailed,
    Toolbox,
    ToolOutcome,
    as_content,
    call_hook,
    call_tool,
)

#: Model calls a conversation may make when --max-turns is not given.
DEFAULT_MAX_TURNS = 20
#: Seconds a tool may run when --tool-timeout is not given.
DEFAULT_TOOL_TIMEOUT = 300.0


class Rollout:
    """A rollout as the run loop's `RequestSource`."""

    def __init__(
        self,
        output: str,
        toolbox: Toolbox,
        *,
        max_turns: int = DEFAULT_MAX_TURNS,
        tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT,
        live: int = 256,
    ) -> None:
        self.output = output
        self.calls_path, self.tools_path = companions(output)
        self.box = toolbox
        self.max_turns = max_turns
        self.tool_timeout = tool_timeout
        self.live = max(1, live)  # conversations held at once: memory bounded by this
        self.summary = RolloutSummary(output, self.calls_path, self.tools_path)
        self._finished = IdSet()
        self._index: ResumeIndex | None = None
        self._journal: Journal | None = None
        self._make: Callable[[bytes], Request] | None = None
        self._outbox: asyncio.Queue[Request | None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the run's, where asks are sent
        self._waiting: dict[str, asyncio.Future[Result]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._complete = False
        self._error: BaseException | None = None
        self._runs: dict[str, _Run] = {}  # the live conversations' counters, by id
        self._closed = False

    # -- RequestSource -------------------------------------------------------------------------

    def prepare(self, scan: InputScan, existing: OutputScan) -> None:
        """Drop finished conversations from what is pending; refuse a first turn edited since
        the calls file answered it, as exec refuses an edited request."""
        self._finished = finished_ids(self.output)
        values = existing.ok.values() if existing.fingerprinted else None
        pending, changed = array("Q"), []
        problems: list[Problem] = []
        wanted = set(scan.pending)  # the lines of this run (a shard's), checked by exec
        for number, offset, raw in iter_lines_at(scan.path):
            if offset not in wanted:
                continue
            obj = orjson.loads(raw)
            cid = obj["custom_id"]
            refused = _refusal(obj)
            if refused is not None and len(problems) < MAX_PROBLEMS:
                problems.append(Problem(scan.path, number, *refused))
            at = existing.ok.slot(call_id(cid, 1)) if values is not None else -1
            if at >= 0 and values is not None:
                stored = values[at]
                if stored != NO_FINGERPRINT and edited(stored, raw, obj):
                    changed.append(cid)
            if cid in self._finished:
                scan.already_done += 1
            else:
                pending.append(offset)
        if problems:
            raise InputError(f"{scan.path}: {problems_text(problems)}; nothing was sent", problems)
        if changed:
            shown = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
            raise InputError(
                f"{scan.path}: {len(changed)} conversation{'s' if len(changed) != 1 else ''} "
                f"changed since {self.calls_path} answered their first turn ({shown}); nothing "
                f"was sent. Restore the request lines, or remove {self.output}, "
                f"{self.calls_path} and {self.tools_path} to start over"
            )
        scan.pending = pending
        scan.done_words = f"conversations already finished in {self.output}"
        self.summary.conversations = scan.total
        self.summary.already_done = scan.already_done
        # read now, before anything is sent: a damaged journal stops the run naming its line
        self._index = ResumeIndex.read(self.calls_path, self.tools_path, self._finished)
        self._finished = IdSet()  # no longer needed: pending lines are the unfinished ones

    async def requests(
        self, lines: Iterator[bytes], make: Callable[[bytes], Request]
    ) -> AsyncIterator[Request]:
        self._make = make
        self._journal = Journal(self.output, self.tools_path)
        outbox: asyncio.Queue[Request | None] = asyncio.Queue()
        self._outbox = outbox
        self._loop = asyncio.get_running_loop()
        more = True
        while True:
            while more and len(self._tasks) < self.live:
                raw = next(lines, None)
                if raw is None:
                    more = False
                    break
                task = asyncio.ensure_future(self._converse(raw))
                self._tasks.add(task)
                task.add_done_callback(self._ended)
            if self._error is not None:
                raise self._error
            if not more and not self._tasks:
                self._complete = True
                return
            request = await outbox.get()
            if request is not None:
                yield request

    def answered(self, request: Request, result: Result) -> None:
        waiter = self._waiting.pop(request.custom_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    @property
    def complete(self) -> bool:
        return self._complete

    async def close(self) -> None:
        self._closed = True  # a conversation that goes on after its cancel sends nothing
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
        if self._journal is not None:
            self._journal.close()
        self.summary.unfinished = (
            self.summary.conversations - self.summary.already_done - self.summary.ended
        )

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
        if self._outbox is not None:
            self._outbox.put_nowait(None)  # wake the feeder: room for the next conversation

    # -- one conversation ----------------------------------------------------------------------

    async def _converse(self, raw: bytes) -> None:
        assert self._make is not None and self._index is not None and self._journal is not None
        first = self._make(raw)
        line = orjson.loads(raw)
        conv = Conversation(first.custom_id, line, _ask=self._ask)
        first.custom_id = call_id(conv.id, 1)
        context.enter(conv)
        run = self._runs[conv.id] = _Run(self._index.journaled(conv.id))
        status, error = "completed", None
        try:
            if self.box.new_state is not None:
                conv.state = await call_hook("new_state", self.box.new_state, line)
            conv.messages = list(first.body.get("messages") or [])
            status, error = await self._turns(conv, run, first)
            final = None
            if self.box.final_state is not None and status != "failed":
                final = orjson.loads(
                    as_json(await call_hook("final_state", self.box.final_state, conv.state))
                )
        except HookFailed as exc:
            status, error, final = "failed", {"message": str(exc), "turn": conv.turn}, None
        except Diverged as exc:
            status, error, final = "failed", {"message": str(exc), "turn": conv.turn}, None
        out: dict[str, Any] = {
            "custom_id": conv.id, "status": status, "turns": run.tally.turns,
            "tool_calls": run.tally.tool_calls, "tool_errors": run.tally.tool_errors,
            "usage": run.tally.usage, "time_s": round(run.tally.time_s, 6),
            "messages": conv.messages,
        }  # fmt: skip
        if self.box.final_state is not None:
            out["final_state"] = final
        if error is not None:
            out["error"] = error
        self._journal.conversation(out)
        self.summary.add(status, run.tally)
        del self._runs[conv.id]

    async def _turns(
        self, conv: Conversation, run: _Run, first: Request
    ) -> tuple[str, dict[str, Any] | None]:
        base = first.body
        while True:
            conv.turn += 1
            run.asks = 0
            if conv.turn == 1:
                request = first
            else:
                body = {**base, "messages": conv.messages}
                request = Request(call_id(conv.id, conv.turn), first.url, body,
                                  fingerprint=_fingerprint(first.url, body))  # fmt: skip
            result = await self._call(request, check=conv.turn > 1, resend_failed=True)
            body = _decoded(result.body)
            run.tally.count(body, result.metrics)
            run.tally.turns += 1
            if not result.ok:
                return "failed", {"message": _failure(result), "turn": conv.turn}
            message = _message(body)
            conv.messages.append(message)
            calls = message.get("tool_calls")
            if calls:
                if conv.turn >= self.max_turns:
                    return "max_turns", None
                for i, call in enumerate(calls):
                    conv.messages.append(await self._tool(conv, run, i, call))
                continue
            if self.box.user_turn is None:
                return "completed", None
            # asked at the last turn too: a checker's verdict on the last answer decides
            nxt = await self._journaled(conv, run, 0, "user_turn", None, self._user_turn)
            if nxt.error:
                return "failed", {"message": nxt.content, "turn": conv.turn, "tool": "user_turn"}
            said = orjson.loads(nxt.content)
            if said is None:
                return "completed", None
            if conv.turn >= self.max_turns:
                return "max_turns", None  # what it would say next is not sent
            conv.messages.append(said)

    async def _tool(self, conv: Conversation, run: _Run, i: int, call: Any) -> dict[str, Any]:
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        name, arguments = function.get("name"), function.get("arguments")
        call_ref = call.get("id") if isinstance(call, dict) else None

        async def run_it() -> ToolOutcome:
            return await call_tool(self.box, name, arguments, self.tool_timeout)

        outcome = await self._journaled(conv, run, i + 1, name, call_ref, run_it)
        run.tally.tool_calls += 1
        run.tally.tool_errors += outcome.error
        return {"role": "tool", "tool_call_id": call_ref, "content": outcome.content}

    async def _journaled(
        self,
        conv: Conversation,
        run: _Run,
        i: int,
        name: Any,
        call_ref: Any,
        make: Callable[[], Any],
    ) -> ToolOutcome:
        """A tool result (or user turn) from the journal, or made now and journaled first.

        Without `new_state` a journaled result is used as it is: the tool is not run again.
        With it, the tool runs again against the rebuilt state and must give the same result.
        """
        assert self._journal is not None
        entry = run.journal.pop((conv.turn, i), None)
        if entry is not None and (entry.get("name"), entry.get("call_id")) != (name, call_ref):
            entry = None  # another call than the one journaled (its turn was answered again)
        if entry is not None and self.box.new_state is None:
            self._skip_asks(conv, run, entry.get("asks", 0))
            return ToolOutcome(entry["content"], entry.get("error", False))
        asks_before = run.asks
        outcome = await make()
        if entry is not None:
            if (entry["content"], entry.get("error", False)) != (outcome.content, outcome.error):
                raise Diverged(
                    f"replaying {name} of turn {conv.turn} against a fresh state gave another "
                    f"result than {self.tools_path} holds: the tools must give the same "
                    "result for the same calls and state (see docs/rollout.md)"
                )
            return outcome
        self._journal.tool({
            "custom_id": conv.id, "turn": conv.turn, "i": i, "name": name, "call_id": call_ref,
            "content": outcome.content, "error": outcome.error, "asks": run.asks - asks_before,
        })  # fmt: skip
        return outcome

    def _skip_asks(self, conv: Conversation, run: _Run, count: int) -> None:
        """A journaled tool not run again: its asks keep their numbers and their counts."""
        assert self._index is not None
        for _ in range(count):
            recorded = self._index.recorded_call(call_id(conv.id, conv.turn, run.next_ask()))
            if recorded is not None:
                response = recorded.get("response") or {}
                run.tally.count(response.get("body"), recorded.get("metrics") or {})
                run.tally.asks += 1

    async def _user_turn(self) -> ToolOutcome:
        conv = context.current_conversation()
        assert self.box.user_turn is not None
        try:
            said = await call_hook("user_turn", self.box.user_turn, list(conv.messages))
        except HookFailed as exc:
            return ToolOutcome(str(exc), True)
        if isinstance(said, str):
            said = {"role": "user", "content": said}
        if said is not None and not (isinstance(said, dict) and said.get("role")):
            return ToolOutcome("user_turn returned neither a str, a message dict nor None", True)
        return as_content("user_turn", said)

    async def _ask(self, conv: Conversation, body: dict[str, Any], url: str) -> AskAnswer:
        if asyncio.get_running_loop() is not self._loop:  # asyncio.run(ask) in a plain tool
            raise AskFailed("ask() must be awaited in an async tool or hook: a plain function "
                            "runs in a worker thread, away from the run's event loop")  # fmt: skip
        run = self._runs.get(conv.id)
        count = run.next_ask() if run is not None else 1
        custom_id = call_id(conv.id, conv.turn, count)
        found = check_request({"custom_id": custom_id, "url": url, "body": body})
        if found:
            field, message = found[0]
            raise AskFailed(f"ask: {field}: {message}")
        request = Request(custom_id, url, body, fingerprint=_fingerprint(url, body))
        result = await self._call(request, check=True)
        body = _decoded(result.body)
        if run is not None:
            run.tally.count(body, result.metrics)
            run.tally.asks += 1
        if not result.ok:
            raise AskFailed(f"ask {custom_id} failed: {_failure(result)}")
        return AskAnswer(custom_id, body)

    async def _call(self, request: Request, *, check: bool, resend_failed: bool = False) -> Result:
        """The answer to `request`: read back from the calls file, or sent through the run.

        A turn that failed for good ended its conversation; when that conversation is rebuilt
        (its line removed, to run it again) the turn is sent again (`resend_failed`). A failed
        ask is read back: it is part of a tool's journaled result."""
        assert self._index is not None and self._outbox is not None
        recorded = self._index.recorded_call(request.custom_id)
        if recorded is not None:
            metrics = recorded.get("metrics") or {}
            mark = metrics.get("fingerprint")
            fresh = request.fingerprint
            if check and isinstance(mark, str) and fresh is not None and mark[:8] != fresh[:8]:
                raise Diverged(
                    f"{request.custom_id} asks other than what {self.calls_path} answered "
                    "(the tools or the request changed since): the conversation cannot resume"
                )
            response = recorded.get("response") or {}
            result = Result(request.custom_id, response.get("status_code"), response.get("body"),
                            request_id=response.get("request_id"), error=recorded.get("error"),
                            metrics=metrics)  # fmt: skip
            if result.ok or not resend_failed:
                self.summary.replayed += 1
                return result
        if self._closed:
            raise asyncio.CancelledError
        waiter: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting[request.custom_id] = waiter
        self._outbox.put_nowait(request)
        return await waiter


class _Run:
    """One conversation's running counters and its journaled entries (a resume)."""

    def __init__(self, journal: dict[tuple[int, int], dict[str, Any]]) -> None:
        self.journal = journal
        self.tally = Tally()
        self.asks = 0  # asks made in this turn so far: the next one's number

    def next_ask(self) -> int:
        self.asks += 1
        return self.asks


def as_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        raise HookFailed(f"final_state returned a {type(value).__name__}, not JSON") from None


def _refusal(line: dict[str, Any]) -> tuple[str, str] | None:
    """(field, why) when a request line cannot start a conversation, else None."""
    if line["url"] != CHAT_URL:
        return "url", f"a rollout runs chat conversations ({CHAT_URL}), not {line['url']}"
    n = line["body"].get("n")
    if isinstance(n, int) and n > 1:  # paid for, and all but the first answer dropped
        return "body.n", f"a rollout follows one answer per turn; n must be 1, not {n}"
    return None


def _fingerprint(url: str, body: dict[str, Any]) -> str:
    return fingerprint(b"", url, body)


def _decoded(body: Any) -> Any:
    if isinstance(body, orjson.Fragment):
        return orjson.loads(orjson.dumps(body))
    return body


def _message(body: Any) -> dict[str, Any]:
    """The assistant turn to keep: role, content and tool calls (reasoning left out)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else {}
    message = first.get("message") if isinstance(first, dict) else None
    message = message if isinstance(message, dict) else {}
    kept: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        kept["tool_calls"] = message["tool_calls"]
    return kept


def _failure(result: Result) -> str:
    error = result.error or {}
    message = error.get("message") if isinstance(error, dict) else None
    return str(message or f"HTTP {result.status_code}")
