"""The tools of a rollout: plain Python functions, found in a file, a module or a dict.

In TOOLS.py each top-level function whose name a model may call is a tool; it is called with
the call's JSON arguments as keywords and nothing else (so an argument may have any name, even
`state`), may be async, and returns a str or anything JSON. Four names are hooks, not tools:
`user_turn(messages)` (the next user message after an answer without a tool call, or None to
end), `new_state(request_line)` (each conversation's own state), `final_state(state)` (what is
saved of it) and `tools` (ignored: a list some files keep). What the run offers a tool comes
through `jsonlbatch.current_conversation()` (`context.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib.util
import inspect
import os
import queue
import sys
import threading
import traceback
import types
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from jsonlbatch.errors import InputError, JsonlbatchError, UsageError
from jsonlbatch.rollouts.context import Diverged

#: Names TOOLS.py may define that are hooks of the run, not tools a model calls.
HOOKS = ("user_turn", "new_state", "final_state")


@dataclass(frozen=True)
class Toolbox:
    """The functions a rollout calls: tools by name, and the hooks TOOLS.py defines."""

    tools: Mapping[str, Callable[..., Any]]
    user_turn: Callable[..., Any] | None = None
    new_state: Callable[..., Any] | None = None
    final_state: Callable[..., Any] | None = None
    origin: str = "tools"  # where they came from, for messages
    _signatures: dict[str, inspect.Signature] = field(default_factory=dict, repr=False)

    def signature(self, name: str) -> inspect.Signature | None:
        if name not in self._signatures:
            try:
                self._signatures[name] = inspect.signature(self.tools[name])
            except (TypeError, ValueError):  # a builtin without one: let the call say
                return None
        return self._signatures[name]


def load_tools(tools: str | os.PathLike[str] | types.ModuleType | Mapping[str, Any]) -> Toolbox:
    """A `Toolbox` from a path to a .py file, an imported module or a dict of functions.

    A file that does not import is an `InputError` naming it and the line the error is on."""
    if isinstance(tools, Mapping):
        return _from_names(dict(tools), "the tools dict", module=None)
    if isinstance(tools, types.ModuleType):
        return _from_names(vars(tools), tools.__name__, module=tools.__name__)
    path = os.fspath(tools)
    if not os.path.isfile(path):
        raise UsageError(f"--tools {path}: no such file (a Python file of tool functions)")
    name = f"jsonlbatch_tools_{abs(hash(os.path.abspath(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--tools {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside it look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # its own bug, reported as the user's file's problem
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise InputError(f"{path} does not import: {_where(exc, path)}") from None
    return _from_names(vars(module), path, module=name)


def _from_names(names: Mapping[str, Any], origin: str, module: str | None) -> Toolbox:
    tools: dict[str, Callable[..., Any]] = {}
    hooks: dict[str, Callable[..., Any]] = {}
    for name, value in names.items():
        if module is None:  # a dict says what it means: each entry is a tool or a hook
            if not callable(value):
                raise UsageError(f"{origin}: {name!r} is a {type(value).__name__}, not a function")
        elif name.startswith("_") or not (inspect.isfunction(value) and value.__module__ == module):
            continue  # the file's own functions only: not its helpers, classes, imports, data
        (hooks if name in HOOKS else tools)[name] = value
    if not tools and not hooks:
        raise UsageError(f"{origin} defines no tool function")
    return Toolbox(
        tools,
        user_turn=hooks.get("user_turn"),
        new_state=hooks.get("new_state"),
        final_state=hooks.get("final_state"),
        origin=origin,
    )


def _where(exc: BaseException, path: str) -> str:
    """`ExcType: message (line N)` for an exception raised while importing `path`."""
    if isinstance(exc, SyntaxError):  # its str() already says "(file, line N)"
        text, line = f"{type(exc).__name__}: {exc.msg}", exc.lineno
    else:  # the import machinery names the file by its absolute path
        here = os.path.abspath(path)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == here]
        text, line = f"{type(exc).__name__}: {exc}", frames[-1].lineno if frames else None
    return f"{text} (line {line})" if line else text


@dataclass
class ToolOutcome:
    """What one tool call gave: the `role: tool` message's content, and whether it failed."""

    content: str
    error: bool = False


async def call_tool(box: Toolbox, name: Any, arguments: Any, timeout: float | None) -> ToolOutcome:
    """Run one tool call; every failure (unknown name, arguments that are not a JSON object or
    do not fit, an exception, a timeout, a result that is not JSON) becomes an error message
    the model sees, never the run's end."""
    fn = box.tools.get(name) if isinstance(name, str) else None
    if fn is None:
        known = ", ".join(sorted(box.tools)) or "none"
        return ToolOutcome(f"error: unknown tool {name!r} (the tools are: {known})", True)
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError as exc:
            return ToolOutcome(f"error: the arguments of {name} are not JSON: {exc}", True)
    if not isinstance(arguments, dict):
        return ToolOutcome(f"error: the arguments of {name} must be a JSON object", True)
    signature = box.signature(name)
    if signature is not None:
        try:
            signature.bind(**arguments)
        except TypeError as exc:
            return ToolOutcome(f"error: bad arguments for {name}: {exc}", True)
    try:
        if inspect.iscoroutinefunction(fn):
            value = await _within(fn(**arguments), timeout)
        else:  # in a thread (the context goes with it): a slow tool holds no other call up
            value = await _within(_in_thread(functools.partial(fn, **arguments)), timeout)
    except TimeoutError:
        return ToolOutcome(f"error: {name} timed out after {timeout:g}s (--tool-timeout)", True)
    except Diverged:  # an ask that is not the one recorded: the conversation cannot go on
        raise
    except Exception as exc:  # the tool's own failure: the model is told, the run goes on
        return ToolOutcome(f"error: {name} raised {raised(exc)}", True)
    return as_content(name, value)


class _Exited(Exception):
    """A tool's `sys.exit()`, carried as an ordinary exception: a SystemExit that leaves an
    asyncio task stops the whole event loop, every conversation with it."""


def raised(exc: BaseException) -> str:
    """`Type: message` of a tool's or hook's exception, a `sys.exit()` as SystemExit."""
    return str(exc) if isinstance(exc, _Exited) else f"{type(exc).__name__}: {exc}"


async def _no_exit(work: Awaitable[Any]) -> Any:
    try:
        return await work
    except SystemExit as exc:
        raise _Exited(f"SystemExit: {exc}") from None


class HookFailed(JsonlbatchError):
    """A hook of TOOLS.py raised (or gave what cannot be saved): its conversation fails."""


async def call_hook(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call a hook of TOOLS.py; a plain one in a thread, as a tool (a checker that runs the
    model's code holds no other conversation up); its exception names it."""
    try:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        value = await _in_thread(functools.partial(fn, *args))
        return await value if asyncio.iscoroutine(value) else value  # a lambda of an async
    except Diverged:
        raise
    except (Exception, SystemExit) as exc:  # an async hook's sys.exit: its conversation fails
        raise HookFailed(f"{name} raised {raised(exc)}") from None


async def _in_thread(call: Callable[[], Any]) -> Any:
    """`call()` on a daemon worker thread, with the caller's context: a plain tool or hook
    (a checker running the model's code) holds no other conversation up.

    Not `asyncio.to_thread`: the loop's executor threads are joined when the run ends and again
    at interpreter exit, so one tool that never returns (past --tool-timeout, its result
    dropped) would hold the finished command open forever. A daemon thread is left behind."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():  # timed out or cancelled meanwhile
            return
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)

    def work() -> None:
        value: Any = None
        exc: BaseException | None = None
        try:
            value = context.run(call)
        except SystemExit as stop:
            exc = _Exited(f"SystemExit: {stop}")
        except BaseException as other:  # handed to the caller, as to_thread would
            exc = other
        with contextlib.suppress(RuntimeError):  # the loop closed while it ran
            loop.call_soon_threadsafe(settle, value, exc)

    _WORKERS.run(work)
    return await future


class _DaemonWorkers:
    """Worker threads for plain tools and hooks: daemons (never joined at exit, so a tool that
    never returns holds nothing open), reused between calls (a thread start costs milliseconds
    on a loaded machine), one more started whenever none is idle. The idle count is a
    semaphore, as in `concurrent.futures.ThreadPoolExecutor`."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)

    def run(self, job: Callable[[], None]) -> None:
        """Run `job` (which raises nothing) on an idle worker, or on a new one."""
        self._jobs.put(job)
        if not self._idle.acquire(blocking=False):
            threading.Thread(target=self._serve, name="jsonlbatch-tool", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get()()
            self._idle.release()


_WORKERS = _DaemonWorkers()


async def _within(work: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
    """`work`'s value, or `TimeoutError` after `timeout` seconds. Not `asyncio.wait_for`: on
    Python 3.10 and 3.11 it swallows a cancellation that meets the work's end, and a rollout
    stopped then would wait for a conversation that goes on."""
    task = asyncio.ensure_future(_no_exit(work))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()  # a thread cannot be stopped: its result is dropped
        raise TimeoutError
    return task.result()


def as_content(name: str, value: Any) -> ToolOutcome:
    """A tool's return value as a tool message's content: a str as it is, else its JSON."""
    if isinstance(value, str):
        try:
            value.encode()  # a lone surrogate (text decoded with surrogateescape) is no JSON
        except UnicodeEncodeError as exc:
            return ToolOutcome(f"error: {name} returned text that is not UTF-8 ({exc.reason} "
                               f"at character {exc.start})", True)  # fmt: skip
        return ToolOutcome(value)
    try:
        return ToolOutcome(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode())
    except TypeError as exc:
        kind = type(value).__name__
        return ToolOutcome(f"error: {name} returned a {kind}, which is not JSON ({exc})", True)
