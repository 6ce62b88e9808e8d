"""Tool calls written as text, as a model served without a tool parser writes them.

With `MockConfig.tool_call_format = "hermes"` (`--tool-call-format hermes`), a reply that calls
a tool carries the call in its content, in the Hermes / Qwen template's form::

    <tool_call>
    {"name": "get_order", "arguments": {"order_id": "..."}}
    </tool_call>

with no `tool_calls` and finish_reason "stop", which is what vLLM answers for such a model
when it runs without `--tool-call-parser`. exec's `--parse-tool-calls hermes` reads it back
(exec/hooks/tool_call_parser.py), so the client's parser is tested end to end against it.
"""

from __future__ import annotations

import json
import re

from jsonlbatch.mock.content import Reply

#: How the mock writes a tool call: as `tool_calls` (a server with a parser) or as text.
TOOL_CALL_FORMATS = ("structured", "hermes")
_TOKEN = re.compile(r"\S+\s*")  # a word and its spacing: one token, as the mock counts them


def as_text(reply: Reply) -> Reply:
    """`reply` with its tool call (if any) written into the content as a `<tool_call>` tag."""
    call = reply.tool_call
    if call is None:
        return reply
    payload = {"name": call.name, "arguments": json.loads(call.arguments)}
    text = f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"
    return Reply(reply.reasoning, [*reply.content, *_TOKEN.findall(text)], None, "stop")
