"""Values given from Python are type-checked before they are converted (issue 46 item 3):
each wrong type is a `UsageError` naming the option and what it takes, before anything runs.

Before: `url=5` and `url=[URL, None]` were `AttributeError`s, `cache=123` a `TypeError`,
`timeout=True` meant 1 second, `max_retries=True` meant 1, `model=123` was "must not be
empty", and `grace`/`backoff_cap` (no command line option) were never checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from batchutil import write_requests

import jsonlbatch
from jsonlbatch.cli.library import build_spec
from jsonlbatch.errors import UsageError

URL = "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"url": 5}, r"option 'url' wants a URL \(a string\) or a list of them, got int"),
        (
            {"url": [URL, None]},
            r"option 'url' wants a URL \(a string\) or a list of them, "
            r"got a list holding NoneType",
        ),
        ({"cache": 123}, r"option 'cache' wants a path \(str or os.PathLike\), got int"),
        ({"timeout": True}, r"option 'timeout' wants a number, got bool"),
        ({"max_retries": True}, r"option 'max_retries' wants an integer, got bool"),
        ({"max_retries": 2.5}, r"option 'max_retries' wants an integer, got float"),
        ({"model": 123}, r"option 'model' wants a string, got int"),
        ({"concurrency": True}, r"option 'concurrency' wants an integer or a string"),
        ({"quiet": "yes"}, r"option 'quiet' wants True or False, got str"),
        ({"no_schema_check": 1}, r"option 'no_schema_check' wants True or False, got int"),
        (
            {"header": ["X=1", 2]},
            r"option 'header' wants a mapping of header: value, or "
            r"KEY=VALUE strings or a list of them, got a list holding int",
        ),
        ({"header": {"X": 1}}, r"option 'header' wants a mapping of strings to strings"),
        ({"rpm": float("nan")}, r"option 'rpm' wants a finite number"),
        ({"grace": "10"}, r"option 'grace' wants a finite number, got str"),
        ({"grace": True}, r"option 'grace' wants a finite number, got bool"),
        ({"backoff_cap": [1]}, r"option 'backoff_cap' wants a finite number, got list"),
        # a pair of the wrong length or contents: a ValueError from unpacking, or a tuple
        # click passed through unchecked (a port "x" kept), before
        ({"shard": (1,)}, r"option 'shard' wants a \(k, n\) pair .*, got a tuple of 1"),
        ({"view_address": ("h",)}, r"option 'view_address' wants a \(host, port\) pair"),
        ({"view_address": ("127.0.0.1", "x")}, r"'127.0.0.1:x' is not HOST:PORT"),
        ({"view_address": ("127.0.0.1", 70000)}, r"is not HOST:PORT \(port 0 to 65535\)"),
    ],
)
def test_a_wrong_type_is_a_usage_error_naming_the_option(
    tmp_path: Path, given: dict, message: str
) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    options = {"url": URL, **given}
    with pytest.raises(UsageError, match=message):
        build_spec(requests, out, **options)
    with pytest.raises(UsageError, match=message):
        jsonlbatch.execute(requests, out, **options)
    assert not out.exists()


def test_the_python_forms_still_work(tmp_path: Path) -> None:
    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    spec = build_spec(
        requests, out, url=(URL,), cache=tmp_path / "c", timeout=30, max_retries=2,
        concurrency="auto", header={"X-A": "1"}, grace=2.5, backoff_cap=None, model=None,
        rpm=60, quiet=True,
    )  # fmt: skip
    opts = spec.options
    assert opts.urls == (URL,) and opts.cache == str(tmp_path / "c") and opts.timeout == 30
    assert opts.max_retries == 2 and opts.concurrency == "auto" and opts.headers == {"X-A": "1"}
    assert opts.grace == 2.5 and opts.backoff_cap is None and opts.model is None  # None: unset
    # an address as a pair, IPv6 included
    spec = build_spec(requests, out, url=URL, view=True, view_address=("::1", 8765))
    assert (spec.watchers[0].host, spec.watchers[0].view_port) == ("::1", 8765)
    # the command line's forms, as strings, are taken too
    assert build_spec(requests, out, url=URL, timeout="30").options.timeout == 30.0
    listed = build_spec(requests, out, url=URL, header=["X-A=1", "X-B=2"]).options.headers
    assert listed == {"X-A": "1", "X-B": "2"}


def test_the_files_are_paths(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"requests wants a path \(str or os.PathLike\), got int"):
        build_spec(5, tmp_path / "out.jsonl", url=URL)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"output wants a path .*, got NoneType"):
        jsonlbatch.execute(tmp_path / "in.jsonl", None, url=URL)  # type: ignore[arg-type]


def test_the_seams_watchdog_and_signal_choice_are_checked_too(tmp_path: Path) -> None:
    """Before: `seams="x"` was an AttributeError, `Seams(check=5)` a TypeError at the first
    answer (the requests already paid for), `watchdog=5` and `handle_signals="no"` taken."""
    from jsonlbatch.exec.hooks.seams import Seams

    requests, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(requests, 1)
    for given, message in (
        ({"seams": "x"}, r"seams wants a jsonlbatch\.Seams, got str"),
        ({"watchdog": 5}, r"watchdog wants a function of no arguments, got int"),
        ({"handle_signals": "no"}, r"handle_signals wants True or False, got str"),
    ):
        with pytest.raises(UsageError, match=message):
            jsonlbatch.execute(requests, out, url=URL, **given)
    with pytest.raises(UsageError, match=r"a check is called with each answer: got int"):
        Seams(check=5)  # type: ignore[arg-type]
    assert not out.exists()
