"""The mock's hosted-API answers are what the SDKs parse, and its structured answers hold the
schema keywords it claims to honour.

Checked with the installed SDKs' own types (openai's `Response`, `ModerationCreateResponse`,
validated strictly, so a missing required field or a wrong type fails), over real HTTP.
"""

from __future__ import annotations

import io
import urllib.request
from collections.abc import Callable
from typing import Any

import jsonschema
import orjson
from batchapiutil import BatchServer, jsonl_lines, wait_batch
from openai.types import ModerationCreateResponse
from openai.types.responses import Response
from test_formats_interop import OPENAI_BATCH_REQUEST_OUTPUT

from jsonlbatch.mock import content


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url + path, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return orjson.loads(answer.read())


def test_responses_and_moderations_bodies_pass_the_openai_types_strictly(
    mock_server: Callable[..., str],
) -> None:
    url = mock_server()
    plain = _post(url, "/responses", {"model": "mock", "input": "Say hi", "max_output_tokens": 2})
    Response.model_validate(plain, strict=True)
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object"},
              "strict": True}]  # fmt: skip
    with_tools = _post(url, "/responses", {"model": "mock", "input": [{"role": "user",
                       "content": "hi"}], "tools": tools, "tool_choice": "none",
                       "parallel_tool_calls": False})  # fmt: skip
    parsed = Response.model_validate(with_tools, strict=True)
    assert parsed.tool_choice == "none" and parsed.parallel_tool_calls is False
    assert parsed.usage is not None and parsed.usage.output_tokens_details.reasoning_tokens == 0
    moderated = _post(url, "/moderations", {"input": ["a kind word", "an attack plan"]})
    result = ModerationCreateResponse.model_validate(moderated, strict=True)
    assert [r.flagged for r in result.results] == [False, True]
    assert result.results[1].categories.violence is True
    assert result.results[1].category_applied_input_types.violence == ["text"]


#: A review schema as a newcomer writes it: bounds on a score and a confidence.
REVIEW = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["accept", "reject"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "margin": {"type": "number", "exclusiveMinimum": 0},
        "penalty": {"type": "integer", "exclusiveMaximum": -3},
        "offset": {"type": ["number", "null"], "minimum": 0, "maximum": 255},
    },
    "required": ["verdict", "confidence", "stars", "margin", "penalty"],
    "additionalProperties": False,
}


def test_structured_answers_hold_numeric_bounds() -> None:
    for seed in range(300):
        body = {"model": "mock", "messages": [{"role": "user", "content": "review it"}],
                "seed": seed}  # fmt: skip
        answer = orjson.loads(content.json_answer(REVIEW, body))
        jsonschema.validate(answer, REVIEW)


def test_structured_answers_through_the_server_hold_bounds(mock_server: Callable[..., str]) -> None:
    url = mock_server()
    for seed in range(20):
        body = {"model": "mock", "messages": [{"role": "user", "content": "review it"}],
                "seed": seed, "response_format": {"type": "json_schema", "json_schema":
                {"name": "review", "schema": REVIEW, "strict": True}}}  # fmt: skip
        chat = _post(url, "/chat/completions", body)
        jsonschema.validate(orjson.loads(chat["choices"][0]["message"]["content"]), REVIEW)


def test_batch_api_results_of_the_mock_pass_the_sdk_types(tmp_path, mock_server) -> None:
    """`serve --batch-api` in front of the mock: an SDK user's results lines parse as the SDK's
    types, and each line holds OpenAI's line schema."""
    server = BatchServer(tmp_path / "state", mock_server()).start()
    try:
        client = server.client()
        for url, model, body in (
            ("/v1/responses", Response, {"model": "mock", "input": "Say hi"}),
            ("/v1/moderations", ModerationCreateResponse, {"input": "an attack plan"}),
        ):
            lines = [{"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}
                     for i in range(3)]  # fmt: skip
            data = b"".join(orjson.dumps(x) + b"\n" for x in lines)
            file_id = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id
            batch = client.batches.create(
                input_file_id=file_id,
                endpoint=url,  # type: ignore[arg-type]
                completion_window="24h",
            )
            done = wait_batch(client, batch.id)
            assert done.status == "completed", done
            results = jsonl_lines(client.files.content(done.output_file_id).text)
            assert len(results) == 3
            for line in results:
                jsonschema.validate(line, OPENAI_BATCH_REQUEST_OUTPUT)
                model.model_validate(line["response"]["body"], strict=True)
    finally:
        server.kill()
