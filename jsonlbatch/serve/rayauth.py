"""Ray's token authentication (Ray >= 2.52) for the clusters `--ray` starts or joins.

A Ray head started with `RAY_AUTH_MODE=token` refuses to start without a token, and a driver
must speak the mode of the cluster it joins. Nothing here relies on `~/.ray/auth_token`, which
exists only on machines where someone once generated it:

- a local cluster this run starts gets a token of its own, in a private file named by
  `RAY_AUTH_TOKEN_PATH` for the head and this driver, removed when the run ends;
- a joined cluster's mode is read (a call to its GCS that a token-guarded cluster refuses), and a
  cluster that wants a token this driver lacks is a clear error naming what to set.

`RAY_AUTH_MODE`, `RAY_AUTH_TOKEN` and `RAY_AUTH_TOKEN_PATH` set by the user are respected as they
are. Older Rays have no authentication: nothing here changes anything for them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from jsonlbatch.errors import LaunchError, UsageError
from jsonlbatch.redact import register_secret

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
_WHERE = (
    f"put the cluster's token in a file named by {TOKEN_PATH_ENV} (or in {TOKEN_ENV}, or in "
    "~/.ray/auth_token)"
)


class RayAuth:
    """The authentication settings of one run's Ray connection; `close` undoes them."""

    def __init__(self) -> None:
        self._exported: dict[str, str | None] = {}  # variable -> its value before us
        self._dir: str | None = None

    def start_local(self) -> None:
        """For a head this run starts: token mode, with a fresh token unless the user gave one
        (`RAY_AUTH_MODE=disabled` from the user turns authentication off)."""
        if os.environ.get(MODE_ENV, "").lower() == "disabled":
            return
        if not (os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV)):
            self._dir = tempfile.mkdtemp(prefix="jsonlbatch-ray-")  # 0700: ours alone
            path = os.path.join(self._dir, "auth_token")
            token = secrets.token_hex(32)
            register_secret(token)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token)
            self._export(TOKEN_PATH_ENV, path)
        self._export(MODE_ENV, "token")

    def join(self, address: str) -> None:
        """Read the auth mode of the cluster at `address` and speak it (unless the user set
        `RAY_AUTH_MODE`); UsageError when it wants a token this driver lacks or refuses it."""
        if MODE_ENV in os.environ or address.startswith("ray://") or address == "auto":
            return
        raylet = _raylet()
        refusal = raylet and getattr(sys.modules["ray.exceptions"], "AuthenticationError", None)
        if not refusal:  # a Ray without token authentication
            return
        if not _refused(raylet.GcsClient, refusal, address):
            return
        if not _driver_has_token():
            raise UsageError(
                f"the Ray cluster at {address} uses token authentication and this driver has "
                f"no token: {_WHERE}"
            )
        self._export(MODE_ENV, "token")
        if _refused(raylet.GcsClient, refusal, address):
            raise UsageError(f"the Ray cluster at {address} refuses this driver's token: {_WHERE}")

    def close(self) -> None:
        """Restore the variables as they were and remove the run's token."""
        for name, value in self._exported.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if self._exported:
            self._exported = {}
            _reload()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _export(self, name: str, value: str) -> None:
        """Set for this driver and every process it starts (the local head among them)."""
        self._exported.setdefault(name, os.environ.get(name))
        os.environ[name] = value
        _reload()


def _refused(client: type, refusal: type[BaseException], address: str) -> bool:
    """Whether the GCS at `address` refuses this driver's credentials (a cheap call: its
    cluster id). A cluster that cannot be reached is LaunchError (Ray waits 40 s to say so)."""
    try:
        client(address=address)
    except refusal:
        return True
    except Exception as exc:
        text = str(exc).strip().splitlines()
        raise LaunchError(
            f"cannot reach Ray at {address}: {text[0] if text else type(exc).__name__}"
        ) from None
    return False


def _driver_has_token() -> bool:
    if os.environ.get(TOKEN_ENV) or os.environ.get(TOKEN_PATH_ENV):
        return True
    return (Path.home() / ".ray" / "auth_token").is_file()


def _reload() -> None:
    """Ray reads its mode and token once and keeps them: have it read them again, as Ray's own
    `ray.init` does when it turns authentication on (no-op before Ray is imported)."""
    raylet = _raylet() if "ray" in sys.modules else None
    if raylet is None or not hasattr(raylet, "AuthenticationTokenLoader"):  # no authentication
        return
    raylet.Config.initialize("")
    with contextlib.suppress(AttributeError):  # a Ray whose loader reads the token each time
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def _raylet() -> Any:
    """Ray's compiled core (its stubs leave out what is used here), or None without Ray."""
    try:
        import ray.exceptions  # noqa: F401  (read through sys.modules by `join`)

        return importlib.import_module("ray._raylet")
    except ImportError:
        return None
