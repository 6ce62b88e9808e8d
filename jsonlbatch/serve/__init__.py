"""The serve stage: launch vLLM, SGLang or the built-in mock, and always tear them down.

`backends` maps one set of options (`ServeOptions`) onto each server's own command line; `gpus`
plans tensor x data parallel groups and ports; `launch` starts each server under a `reaper` in its
own process group, waits until it is ready and stops the whole group on exit, Ctrl-C or SIGKILL
of jsonlbatch itself.

    from jsonlbatch.serve import ServeOptions, serving
    with serving(ServeOptions("vllm", model_path="Qwen/Qwen3-8B", dp_size=2)) as servers:
        print(servers.urls)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jsonlbatch.lazy import lazy
from jsonlbatch.serve.backends import BACKEND_NAMES, DP_MODES, ServeOptions, build_command

#: Loaded on first use: naming the backends and their options (the CLI's `--serve` flags) must
#: not import the launcher.
_LAZY = {
    "Servers": "jsonlbatch.serve.launch",
    "plan_servers": "jsonlbatch.serve.launch",
    "serving": "jsonlbatch.serve.start",
}

if TYPE_CHECKING:
    from jsonlbatch.serve.launch import Servers, plan_servers
    from jsonlbatch.serve.start import serving


__getattr__, __dir__ = lazy(__name__, _LAZY)


__all__ = [
    "BACKEND_NAMES",
    "DP_MODES",
    "ServeOptions",
    "Servers",
    "build_command",
    "plan_servers",
    "serving",
]
