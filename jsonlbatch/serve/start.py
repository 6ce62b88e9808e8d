"""Servers for the length of a block: `serving(options)` picks how they are launched.

Local processes (`launch.Servers`) or Ray actors (`raycluster.RayServers`, the optional `ray`
extra) both start, wait until ready and stop under `launch.running`. The choice lives here, above
both, so that `launch` does not know `raycluster`, which builds on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

from jsonlbatch.serve.backends import BACKENDS, ServeOptions
from jsonlbatch.serve.launch import (
    Servers,
    plan_servers,
    run_log_dir,
    running,
    warn_gpu_holders,
)


@contextlib.contextmanager
def serving(
    options: ServeOptions,
    *,
    quiet: bool = False,
    log_stem: str | None = None,
    stop: threading.Event | None = None,
) -> Iterator[Servers]:
    """Start the servers `options` describe, wait until all serve, yield them, stop them.

    Startup raises LaunchError with the server's own last log lines when a server exits or
    does not become ready in time. Ctrl-C (KeyboardInterrupt), and SIGTERM where no handler
    is installed, become Interrupted, during startup or in the block. Teardown runs however the
    block ends; `stop`, set from another thread during startup (a cancelled `aexecute`), ends
    the wait with Interrupted too. Logs go beside `log_stem` (exec's output), in `options.log_dir`, or else in a
    fresh directory under the system's temp dir (each server's start line names its log).
    """
    if log_stem is None and options.log_dir is None:  # nothing to put the logs beside
        options = dataclasses.replace(options, log_dir=run_log_dir(options.backend))
    if options.ray:
        from jsonlbatch.serve.raycluster import RayServers  # Ray is an optional extra

        servers: Servers = RayServers(options, log_stem=log_stem, quiet=quiet)
    else:
        BACKENDS[options.backend].require(options)  # installed here (Ray's nodes: not seen)
        servers = Servers(options, plan_servers(options, log_stem=log_stem), quiet=quiet)
    if BACKENDS[options.backend].needs_gpus and not options.ray:
        warn_gpu_holders(servers)
    with running(servers, stop):
        yield servers
