"""Credentials with control characters (exec/route/credentials.py): one trailing newline is taken
off, anything else is a usage error naming the option, never a traceback, never the secret."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from batchutil import ENV, cli, read_results, write_requests

from jsonlbatch import execute
from jsonlbatch.errors import UsageError

KEY = "sk-h46-credential-0123456789"


def _requests(tmp_path: Path) -> Path:
    path = tmp_path / "req.jsonl"
    write_requests(path, 3, max_tokens=2)
    return path


def test_a_key_ending_in_a_newline_is_sent_without_it(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server(api_key=KEY)  # answers 401 to any other key
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--url", url, "-q",
               env={**ENV, "OPENAI_API_KEY": KEY + "\n"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(read_results(out)) == 3
    summary = execute(_requests(tmp_path), tmp_path / "py.jsonl", urls=[url], api_key=KEY + "\r\n",
                      quiet=True)  # fmt: skip
    assert summary.succeeded == 3


@pytest.mark.parametrize(
    ("args", "env_key", "named"),
    [
        (("--header", f"X-Token={KEY}\r\nX-Evil: 1"), None, "--header X-Token"),
        (("--header", f"X-Token={KEY}\n\n"), None, "--header X-Token"),
        (("--api-key", f"{KEY}\x00"), None, "--api-key"),
        ((), f"{KEY}\nsecond-line", "$OPENAI_API_KEY"),
        (("--header", f"X\nY={KEY}"), None, "header name"),
    ],
)
def test_control_characters_are_a_usage_error_naming_the_option(
    tmp_path: Path, mock_server: Callable[..., str], args: tuple[str, ...], env_key, named
) -> None:
    url = mock_server()
    out = tmp_path / "out.jsonl"
    env = {**ENV, "OPENAI_API_KEY": env_key} if env_key else ENV
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--url", url, "-q", *args,
               env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and KEY not in done.stderr
    assert named in done.stderr
    assert not out.exists()


def test_a_settings_file_header_with_a_newline_inside_is_refused(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server()
    settings = tmp_path / "settings.yaml"
    settings.write_text(f'exec:\n  header: ["X-Token={KEY}\\r\\nX-Evil: 1"]\n')
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--url", url, "-q",
               "--config", str(settings))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--header X-Token holds a control character" in done.stderr
    assert "Traceback" not in done.stderr and KEY not in done.stderr


def test_python_headers_and_keys_are_checked_too(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server()
    with pytest.raises(UsageError, match="--header X-Token holds a control character") as err:
        execute(_requests(tmp_path), tmp_path / "o.jsonl", urls=[url],
                headers={"X-Token": f"{KEY}\r\nX-Evil: 1"}, quiet=True)  # fmt: skip
    assert KEY not in str(err.value)
    with pytest.raises(UsageError, match="--api-key"):
        execute(_requests(tmp_path), tmp_path / "o.jsonl", urls=[url], api_key=f"a\tb{KEY}",
                quiet=True)  # fmt: skip
    assert not (tmp_path / "o.jsonl").exists()


def test_url_userinfo_with_an_api_key_is_a_usage_error_not_a_traceback(
    tmp_path: Path, mock_server: Callable[..., str]
) -> None:
    url = mock_server().replace("http://", "http://user:pw-h46-secret@")
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--url", url, "-q",
               "--api-key", KEY)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "carries user:password@ and an API key" in done.stderr
    assert "Traceback" not in done.stderr and "pw-h46-secret" not in done.stderr
    # userinfo alone is HTTP Basic auth: still sent
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--url", url, "-q")
    assert done.returncode == 0, done.stderr


def test_a_launched_servers_key_is_checked_too(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    done = cli("exec", str(_requests(tmp_path)), "-o", str(out), "--serve", "mock", "-q",
               "--server-api-key", f"{KEY}\r\nX-Evil: 1")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--server-api-key (or $JSONLBATCH_SERVER_API_KEY) holds a control" in done.stderr
    assert "Traceback" not in done.stderr and KEY not in done.stderr and not out.exists()
