"""`exec --batch-api`: the options and the run's target (`batchapi/client/provider_target.py`).

Kept beside exec's own module so `cli/exec.py` only grows by a decorator and one branch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from jsonlbatch.batchapi.formats.batch_objects import DEFAULT_POLL_S, DEFAULT_WINDOW
from jsonlbatch.cli.params import SECONDS
from jsonlbatch.errors import UsageError

if TYPE_CHECKING:
    from jsonlbatch.batchapi.client.provider_target import ProviderBatch

_F = TypeVar("_F", bound=Callable[..., Any])

_OPTIONS = [
    click.option(
        "--batch-api",
        is_flag=True,
        help="Send through the URL's batch API at half the price (OpenAI, Azure, Anthropic "
        "Message Batches, Gemini batch mode): submit, watch, merge. Re-running resumes.",
    ),
    click.option(
        "--batch-provider",
        type=click.Choice(["openai", "anthropic", "gemini"]),
        help="--batch-api: whose batch API (default: from the URL's host, else /v1/messages "
        "lines go to Anthropic and the rest to OpenAI's).",
    ),
    click.option(
        "--completion-window",
        default=DEFAULT_WINDOW,
        callback=lambda ctx, param, value: _window(value),
        show_default=True,
        help="--batch-api: the batches' completion window (OpenAI takes only 24h).",
    ),
    click.option(
        "--batch-metadata",
        multiple=True,
        metavar="KEY=VALUE",
        help="--batch-api: metadata for every batch created (repeat).",
    ),
    click.option(
        "--batch-max-requests",
        type=click.IntRange(min=1),
        help="--batch-api: requests per batch at most (default: the provider's, e.g. "
        "50,000 OpenAI, 100,000 Anthropic).",
    ),
    click.option(
        "--batch-max-bytes",
        type=click.IntRange(min=1),
        help="--batch-api: bytes per batch at most (default: the provider's, e.g. 200 MB "
        "OpenAI, 256 MB Anthropic).",
    ),
    click.option(
        "--price-file",
        type=click.Path(dir_okay=False, exists=True),
        help="--batch-api: prices per model (JSON or YAML: MODEL: {in, out, cached, write, "
        "batch}) beside the built-in table; --price sets one price for every model.",
    ),
    click.option(
        "--poll-interval",
        type=SECONDS,
        default=DEFAULT_POLL_S,
        show_default=True,
        metavar="SECONDS",
        help="--batch-api: first wait between status checks; grows while nothing changes.",
    ),
]


def _window(value: str) -> str:
    from jsonlbatch.batchapi.formats.batch_objects import window_seconds

    try:
        window_seconds(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


#: The Batch API options' names (what `--help` lists under "Batch API").
BATCH_NAMES = _NAMES = (
    "batch_api",
    "batch_provider",
    "completion_window",
    "batch_metadata",
    "batch_max_requests",
    "batch_max_bytes",
    "price_file",
    "poll_interval",
)


def batch_api_options(func: _F) -> _F:
    """Add the `--batch-api` options to a click command."""
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def pop_batch_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take this module's options out of exec's kwargs."""
    return {name: kwargs.pop(name) for name in _NAMES}


def batch_target(batch: dict[str, Any], max_cost: float | None) -> ProviderBatch:
    """`exec --batch-api`: the run's target (submit, watch, merge), from the Batch API's own
    options (`max_cost`: the budget, priced by --price or the table; cli/option_use.py has
    already refused what such a run does not use)."""
    from jsonlbatch.batchapi.client.provider_target import ProviderBatch
    from jsonlbatch.batchapi.client.submit_options import BatchOptions
    from jsonlbatch.pricing.prices import load_price_file

    metadata = {}
    for item in batch["batch_metadata"]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--batch-metadata wants KEY=VALUE, got {item!r}")
        metadata[key] = value
    options = BatchOptions(
        completion_window=batch["completion_window"],
        metadata=metadata,
        max_requests=batch["batch_max_requests"],
        max_bytes=batch["batch_max_bytes"],
        provider=batch["batch_provider"],
        poll_interval=batch["poll_interval"],
        prices=load_price_file(batch["price_file"]) if batch["price_file"] else {},
        max_cost=max_cost,
    )
    return ProviderBatch(options)
