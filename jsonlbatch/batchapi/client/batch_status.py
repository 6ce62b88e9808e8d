"""`jsonlbatch batches status|cancel OUT`: look at and cancel the batches of an output."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import aiohttp

from jsonlbatch.batchapi.client.providers import PROVIDERS, open_api
from jsonlbatch.batchapi.client.result_merge import batch_count
from jsonlbatch.batchapi.client.submit_state import State
from jsonlbatch.batchapi.formats.batch_objects import TERMINAL
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.route.endpoints import parse_endpoint


async def batches_of(
    output: str | os.PathLike[str],
    *,
    url: str | None = None,
    api_key: str | None = None,
    headers: Mapping[str, str] | None = None,
    cancel: bool = False,
) -> list[dict[str, Any]]:
    """One row per part of OUT's batch runs: part, requests, batch id and its live status
    (asked from the API, unless the part's results are already merged). With `cancel`, every
    batch still running is asked to stop first."""
    state = State.for_output(output)
    if not state.parts:
        raise UsageError(f"{output} has no batch state ({state.path} is missing)")
    url = url or state.url
    if not url:
        raise UsageError("give --url: the state does not say where its batches are")
    endpoint = parse_endpoint(url)
    rows = []
    async with aiohttp.ClientSession(trust_env=False) as session:
        provider = PROVIDERS[state.provider or "openai"]  # states before providers: OpenAI's
        api = open_api(provider, endpoint, session, api_key=api_key, headers=headers, max_retries=2)
        for part in state.parts:
            row: dict[str, Any] = {
                "part": part.index,
                "requests": part.count,
                "batch_id": part.batch_id,
                "status": part.status,
                "completed": part.completed,
                "failed": part.failed,
                "merged": part.merged,
            }
            if part.batch_id and not part.merged:
                batch = await api.retrieve(part.batch_id)
                if cancel and batch.get("status") not in TERMINAL:
                    batch = await api.cancel(part.batch_id)
                row.update(
                    status=batch.get("status"),
                    completed=batch_count(batch, "completed"),
                    failed=batch_count(batch, "failed"),
                )
            rows.append(row)
    return rows
