"""What shapes a run besides its two files: `ExecOptions`, checked when it is made.

Its own module so the CLI, the batch API runner and the experiment runner can build options
without importing the run loop, and so every check of an option value sits in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from jsonlbatch.batch_format.records import is_priority
from jsonlbatch.cache.store import MODES as CACHE_MODES
from jsonlbatch.errors import UsageError
from jsonlbatch.exec.hooks.tool_call_parser import PARSERS as TOOL_CALL_PARSERS
from jsonlbatch.exec.prepare.input_scan import CHANGED_POLICIES
from jsonlbatch.exec.route.credentials import check_url_credentials, clean_headers, clean_secret
from jsonlbatch.exec.route.router import RouteOptions
from jsonlbatch.exec.send.body_caps import MAX_RESPONSE_BYTES, STREAM_STALL_S
from jsonlbatch.exec.send.file_collect import MAX_FILE_BYTES
from jsonlbatch.pricing.cost import Price

DEFAULT_CONCURRENCY = 256  # requests in flight when none is given and nothing is tuned
AUTO_MAX_CONCURRENCY = 1024  # the most requests in flight a tuned run has, over all endpoints


@dataclass
class ExecOptions:
    """Everything that shapes a run besides its two files. Field docs are the CLI's help."""

    urls: Sequence[str] = ()
    #: Requests in flight: a number (fixed), "auto" (tuned per endpoint, exec/route/adaptive_concurrency.py), or
    #: None: auto for launched servers and URLs with vLLM/SGLang /metrics, else 256.
    concurrency: int | str | None = None
    model: str | None = None  # override every body's model; "auto" = the one served
    api_key: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 1800.0  # per attempt; reasoning models and cold caches need long ones
    max_response_bytes: int = MAX_RESPONSE_BYTES  # one answer, decoded (exec/send/body_caps.py)
    stream_stall_timeout: float = STREAM_STALL_S  # bytes but no output this long: a failure
    max_retries: int = 8
    ready_timeout: float = 1800.0  # how long a refusing or dead server is waited for
    retry_failed: bool = False
    changed: str = "refuse"  # requests edited since their result: refuse, resend or keep
    stream: bool = False
    shard: tuple[int, int] | None = None  # (k, n), k 0-based
    quiet: bool = False
    grace: float = 10.0  # seconds in-flight requests get after the first Ctrl-C
    backoff_base: float = 1.0  # the first retry's delay; doubles per attempt, with jitter
    backoff_cap: float | None = None  # the longest; None: 8 x backoff_base (exec/send/retry.py)
    route: str = RouteOptions.policy  # prefix | least-busy | round-robin (see exec/route/router.py)
    order_window: int = RouteOptions.order_window
    balance_abs_threshold: int | None = RouteOptions.balance_abs_threshold
    balance_rel_threshold: float = RouteOptions.balance_rel_threshold
    rpm: float | None = None  # requests per minute, across all workers and endpoints
    tpm: float | None = None  # tokens per minute (prompt estimate + output cap, then real usage)
    #: Every request's priority, higher = more important (exec/send/priority.py); a line's own
    #: `priority` wins. None: none sent.
    priority: int | None = None
    rate_limits: bool = True  # learn limits from the providers' rate-limit headers
    price: Price | None = None  # dollars per million tokens: spend shown, --max-cost enforced
    max_cost: float | None = None  # dollars for the whole output file, resumed runs included
    cache: str | None = None  # answer cache folder (jsonlbatch/cache/): look up, then store
    cache_mode: str = "rw"  # rw | read | write
    cache_key_url: bool = False  # the endpoints' URLs are part of the cache key
    reask: int = 0  # more asks for an answer that breaks its request's schema (contract_check.py)
    reask_feedback: bool = False  # re-ask as a follow-up turn quoting the validator's message
    fit_context: bool = False  # a context-overflow refusal: once more with max_tokens cut to fit
    schema_check: bool = True  # check answers against their requests' schemas
    #: Read tool calls written as text into `tool_calls` (exec/hooks/tool_call_parser.py):
    #: "hermes" (<tool_call>{...}</tool_call>), or None: answers kept as sent.
    parse_tool_calls: str | None = None
    files_dir: str | None = None  # collect hosted code interpreter files (send/file_collect.py)
    require_files: bool = False  # an answer that produced no file fails as `no_files`
    max_file_bytes: int = MAX_FILE_BYTES  # the largest file --files-dir collects

    def __post_init__(self) -> None:
        self.route_options()  # checks the routing options
        self.api_key = clean_secret(self.api_key, "--api-key (or $OPENAI_API_KEY)")
        self.headers = clean_headers(self.headers)
        check_url_credentials(self.urls, self.api_key, self.headers)
        if self.concurrency == "auto" or self.concurrency is None:
            pass
        elif not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1, or auto")
        if self.priority is not None and not is_priority(self.priority):
            raise UsageError(f"--priority must be an integer, got {self.priority!r}")
        if self.max_retries < 0:
            raise UsageError("--max-retries must be 0 or more")
        if self.timeout <= 0 or self.ready_timeout < 0:
            raise UsageError("--timeout must be positive and --ready-timeout not negative")
        if self.max_response_bytes < 1024 or self.stream_stall_timeout <= 0:
            raise UsageError(
                "--max-response-bytes must be at least 1KiB and --stream-stall-timeout positive"
            )
        if self.changed not in CHANGED_POLICIES:
            raise UsageError(f"--changed must be one of: {', '.join(CHANGED_POLICIES)}")
        if (self.rpm is not None and self.rpm <= 0) or (self.tpm is not None and self.tpm <= 0):
            raise UsageError("--rpm and --tpm must be positive")
        if self.cache_mode not in CACHE_MODES:
            raise UsageError(f"--cache-mode must be one of: {', '.join(CACHE_MODES)}")
        if self.reask < 0:
            raise UsageError("--reask must be 0 or more")
        if self.reask > self.max_retries:
            raise UsageError(
                f"--reask {self.reask} needs --max-retries {self.reask} or more: each re-ask "
                "is an attempt of its request"
            )
        if self.require_files and self.files_dir is None:
            raise UsageError("--require-files needs --files-dir DIR (where the files go)")
        if self.max_file_bytes < 1:
            raise UsageError("--max-file-bytes must be at least 1")
        if self.files_dir is not None and self.cache is not None and self.cache_mode != "write":
            raise UsageError(
                "--files-dir with --cache: a cached answer's container has expired, so its "
                "files cannot be collected; use --cache-mode write, or --cache off (the cache "
                "may come from $JSONLBATCH_CACHE)"
            )
        if self.reask_feedback and not self.reask:
            raise UsageError("--reask-feedback says how to re-ask: give --reask N too")
        if self.parse_tool_calls is not None and self.parse_tool_calls not in TOOL_CALL_PARSERS:
            raise UsageError(f"--parse-tool-calls must be one of: {', '.join(TOOL_CALL_PARSERS)}")
        if self.max_cost is not None:
            if self.max_cost < 0:
                raise UsageError("--max-cost must not be negative")
            if self.price is None:
                raise UsageError("--max-cost needs --price in=DOLLARS,out=DOLLARS (per 1M tokens)")

    def route_options(self) -> RouteOptions:
        return RouteOptions(
            self.route, self.balance_abs_threshold, self.balance_rel_threshold,
            order_window=self.order_window, concurrency=self.fixed_concurrency,
        )  # fmt: skip

    @property
    def fixed_concurrency(self) -> int:
        """The number of requests in flight where it is not tuned."""
        return self.concurrency if isinstance(self.concurrency, int) else DEFAULT_CONCURRENCY
