"""Rollouts: conversations with tools, run to their end over exec's run loop.

`jsonlbatch rollout REQUESTS -o CONVERSATIONS --tools TOOLS.py` (cli/rollout.py) and
`jsonlbatch.rollout(...)` build exec's `RunSpec` with a `Rollout` (driver.py) as its request
source: every model call takes exec's path and lands in the calls file beside CONVERSATIONS.

- `tools.py`: TOOLS.py's functions (tools and hooks), and calling one safely;
- `context.py`: `current_conversation()`, what a tool sees (id, turn, state, `ask`);
- `journal.py`: the files, the tool journal, what a resume reads back;
- `driver.py`: the conversations as a request source (no barrier, exactly once);
- `rollout_summary.py`: the counts.

docs/rollout.md explains the files, the guarantees and the tool interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jsonlbatch.lazy import lazy

_LAZY = {
    "AskAnswer": "jsonlbatch.rollouts.context",
    "AskFailed": "jsonlbatch.rollouts.context",
    "Conversation": "jsonlbatch.rollouts.context",
    "current_conversation": "jsonlbatch.rollouts.context",
    "Rollout": "jsonlbatch.rollouts.driver",
    "RolloutSummary": "jsonlbatch.rollouts.rollout_summary",
    "Toolbox": "jsonlbatch.rollouts.tools",
    "load_tools": "jsonlbatch.rollouts.tools",
}

if TYPE_CHECKING:
    from jsonlbatch.rollouts.context import AskAnswer, AskFailed, Conversation, current_conversation
    from jsonlbatch.rollouts.driver import Rollout
    from jsonlbatch.rollouts.rollout_summary import RolloutSummary
    from jsonlbatch.rollouts.tools import Toolbox, load_tools

__getattr__, __dir__ = lazy(__name__, _LAZY)

__all__ = [
    "AskAnswer",
    "AskFailed",
    "Conversation",
    "Rollout",
    "RolloutSummary",
    "Toolbox",
    "current_conversation",
    "load_tools",
]
