"""How the mock behaves (`MockConfig`: models, speed, injected faults, limits; every value
checked when it is made) and what it saw (`MockStats`: what a test reads to prove a client sent
no more and no less than needed)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from jsonlbatch.errors import UsageError
from jsonlbatch.mock import content, hermes_calls
from jsonlbatch.mock.gpu import GpuModel

_RATES = (
    "fail_rate",
    "rate_limit_rate",
    "drop_rate",
    "hang_rate",
    "stream_error_rate",
    "break_json",
    "tool_rate",
)
_DURATIONS = ("latency", "latency_jitter", "warmup")


@dataclass
class MockConfig:
    """How the mock behaves: which models it serves, how fast it answers, which faults it
    injects. Every random choice comes from `seed`, so a run can be replayed."""

    served_models: tuple[str, ...] = ("mock",)
    accept_any_model: bool = False
    latency: float = 0.0
    latency_jitter: float = 0.0
    tokens_per_second: float | None = None
    default_max_tokens: int = content.DEFAULT_MAX_TOKENS
    fail_rate: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after: float | None = 1.0  # None: injected 429s carry no Retry-After
    drop_rate: float = 0.0
    hang_rate: float = 0.0  # share never answered: held until the client gives up
    stream_error_rate: float = 0.0
    break_json: float = 0.0  # share of schema answers broken (content.json_answer), by request
    tool_rate: float = 0.0  # share of "auto" tool requests that call a tool (content.compose)
    api_key: str | None = None
    max_model_len: int | None = None
    warmup: float = 0.0
    reasoning: bool = False
    seed: int = 0
    gpu: GpuModel | None = None  # behave like a GPU server (mock/gpu.py); None: fixed latency
    rpm: float | None = None  # enforced limits (mock/limits.py), with provider headers
    tpm: float | None = None
    rate_limit_burst: float = 1.0  # seconds of rate a limit's bucket holds
    rate_limit_headers: str = "openai"  # or "anthropic"
    record_bodies: int = 0  # keep the last N request bodies received (GET /mock/bodies)
    tool_call_format: str = "structured"  # or "hermes": calls as <tool_call> text (hermes_calls.py)
    container_ttl: float | None = None  # code interpreter containers expire (mock/containers.py)
    uncited_file: bool = False  # the interpreter writes one file its answer does not cite

    def __post_init__(self) -> None:
        if isinstance(self.served_models, str):
            self.served_models = (self.served_models,)
        self.served_models = tuple(self.served_models)
        if not self.served_models or not all(isinstance(m, str) and m for m in self.served_models):
            raise UsageError("served_models must list at least one non-empty model name")
        for name in _RATES:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UsageError(f"{name} must be between 0 and 1, got {value}")
        if self.fail_rate + self.rate_limit_rate + self.drop_rate + self.hang_rate > 1.0:
            raise UsageError(
                "fail_rate + rate_limit_rate + drop_rate + hang_rate must not exceed 1"
            )
        if self.retry_after is not None and self.retry_after < 0:
            raise UsageError(f"retry_after must not be negative, got {self.retry_after}")
        if self.record_bodies < 0:
            raise UsageError(f"record_bodies must not be negative, got {self.record_bodies}")
        for name in _DURATIONS:
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.tokens_per_second is not None and self.tokens_per_second <= 0:
            raise UsageError(f"tokens_per_second must be positive, got {self.tokens_per_second}")
        if self.default_max_tokens < 1:
            raise UsageError(
                f"default_max_tokens must be at least 1, got {self.default_max_tokens}"
            )
        if self.tool_call_format not in hermes_calls.TOOL_CALL_FORMATS:
            raise UsageError(f"tool_call_format must be one of: "
                             f"{', '.join(hermes_calls.TOOL_CALL_FORMATS)}")  # fmt: skip
        if self.max_model_len is not None and self.max_model_len < 1:
            raise UsageError(f"max_model_len must be at least 1, got {self.max_model_len}")


@dataclass
class MockStats:
    """What the server saw, so tests can prove a client sent no more and no less than needed."""

    requests: Counter[str] = field(default_factory=Counter)  # by path
    responses: Counter[int] = field(default_factory=Counter)  # by status code
    dropped: int = 0
    hung: int = 0
    stream_errors: int = 0
    #: The last `MockConfig.record_bodies` generation request bodies, oldest first.
    bodies: deque[dict[str, Any]] = field(default_factory=deque)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "responses": {str(k): v for k, v in self.responses.items()},
            "dropped": self.dropped,
            "hung": self.hung,
            "stream_errors": self.stream_errors,
        }
