"""Writing OpenAI Batch request files: request bodies, samples, thinking switches.

`RequestWriter` is the one place a request line is made, whether from `jsonlbatch gen` or
from a user's own pipeline, so the CLI and the API cannot disagree. Every line it writes
passes `records.check_request`, the check `jsonlbatch exec` applies when it reads the file.

The file appears only when complete: lines go to a temp file beside the target, which is
renamed over it on success and removed on any error, so a half-written request file never
looks like a finished one.

What the writer is given comes from beside it: the body fields every request starts from
(`body_fields.py`: `--body-file`, `--param`, merge patches), and a source's rows made into its
prompts (`row_requests.py`: `write_requests`, each row's id and errors naming the row).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from jsonlbatch.answer_contract.contract import SchemaError
from jsonlbatch.answer_contract.schema_forms import DEFAULT_NAME, check_declared, with_schema
from jsonlbatch.batch_format.records import (
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    MESSAGES_URL,
    MODERATIONS_URL,
    RESPONSES_URL,
    check_request,
    request_line,
)
from jsonlbatch.errors import InputError, OutputError, UsageError
from jsonlbatch.file_io.output_guard import check_output
from jsonlbatch.gen.body_fields import merge_patch
from jsonlbatch.gen.schemas import SchemaLike, as_schema, checked_schema, row_schema, strict_ok
from jsonlbatch.pricing.cost import image_tokens

#: The endpoints the generator writes bodies for, and the body field each one's prompt goes in.
PROMPT_FIELDS = {
    CHAT_URL: "messages",
    COMPLETIONS_URL: "prompt",
    EMBEDDINGS_URL: "input",
    RESPONSES_URL: "input",
    MESSAGES_URL: "messages",
    MODERATIONS_URL: "input",
}
#: Endpoints that take chat messages (a string prompt becomes one user message).
CHAT_LIKE = frozenset({CHAT_URL, RESPONSES_URL, MESSAGES_URL})
#: Endpoints that generate nothing: generation fields have no meaning there.
_NO_GENERATION = frozenset({EMBEDDINGS_URL, MODERATIONS_URL})

#: Body fields that only make sense when something is generated.
GENERATION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "n", "seed", "stop")

#: What `--no-think-suffix` appends to the last user message (Qwen3's prompt-level switch).
NO_THINK_SUFFIX = "/no_think"

#: Characters per token of the prompt-token estimate: a rough English-text average.
CHARS_PER_TOKEN = 4


class RequestError(InputError):
    """A request that cannot be written: `fields` holds (field, message) pairs saying why."""

    def __init__(
        self, custom_id: str, fields: list[tuple[str, str]], *, repeats: int | None = None
    ) -> None:
        super().__init__(f"request {custom_id!r}: " + "; ".join(f"{f}: {m}" for f, m in fields))
        self.custom_id = custom_id
        self.fields = fields
        self.repeats = repeats  # a repeated id: the 0-based number of the prompt that had it


@dataclass(frozen=True)
class GenSummary:
    """What a writer wrote."""

    path: str
    prompts: int
    requests: int
    prompt_chars: int
    image_tokens: int = 0  # as billed, from each picture's size (`cost.image_tokens`)
    uncounted_media: int = 0  # image parts by URL and file parts: not in the estimate

    @property
    def prompt_tokens_estimate(self) -> int:
        """Prompt tokens sent, text estimated as characters / 4 (no tokenizer: a rough guide
        only), plus the image tokens."""
        return math.ceil(self.prompt_chars / CHARS_PER_TOKEN) + self.image_tokens


class RequestWriter:
    """Write a request file one prompt at a time, holding only the set of ids seen.

    `body_defaults` (temperature=..., max_tokens=..., any body field) go into every request,
    on top of `body` (the same as one mapping, e.g. a JSON file's); `add` may override them
    per prompt. With `samples=K` each prompt becomes K requests
    `<id><sample_sep><k>` for k = `first_sample` .. `first_sample`+K-1 (Agentless naming: it
    numbers from 0, and from 1 with its `--skip_greedy`, which leaves out the greedy sample 0);
    `greedy_first` makes sample 0 greedy (temperature 0, a single choice), and a `seed` becomes
    seed + k per sample (the same sample number always gets the same seed).
    `no_think` / `think_budget` set the chat-template and server switches of reasoning models;
    `no_think_suffix` appends `/no_think` to the last user message for servers that take no
    `chat_template_kwargs`; `suffix` appends any text there (e.g. an experiment condition's).
    `schema` (a JSON Schema or a Pydantic model) is declared as the answer's contract in the
    endpoint's form (`schema_forms.with_schema`; `strict` when the schema allows it); `add` takes
    one per prompt too.

    Local pictures and files go into a prompt's content as parts made by `image_part`,
    `file_part` or `data_url` (`jsonlbatch.gen`, the functions gen's template filters call).

    Use it as a context manager: the file replaces `path` when the block ends without an
    exception; otherwise nothing is written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        model: str | None = None,
        url: str = CHAT_URL,
        force: bool = False,
        samples: int | None = None,
        greedy_first: bool = False,
        sample_sep: str = "|",
        first_sample: int = 0,
        no_think: bool = False,
        no_think_suffix: bool = False,
        think_budget: int | None = None,
        body: Mapping[str, Any] | None = None,
        suffix: str | None = None,
        inputs: Sequence[str | None] = (),
        schema: SchemaLike | None = None,
        schema_name: str = DEFAULT_NAME,
        **body_defaults: Any,
    ) -> None:
        if url not in PROMPT_FIELDS:
            raise UsageError(
                f"cannot write requests for {url!r} (known: {', '.join(PROMPT_FIELDS)})"
            )
        _check_options(
            url,
            samples,
            greedy_first,
            sample_sep,
            first_sample,
            no_think,
            no_think_suffix or bool(suffix),
            think_budget,
        )
        base = merge_patch(body or {}, body_defaults)
        if url in _NO_GENERATION and (pointless := [k for k in GENERATION_FIELDS if k in base]):
            raise UsageError(
                f"{', '.join(pointless)}: no meaning for {url}, which generates nothing"
            )
        if model is not None:  # first in the body, where a reader looks for it
            base.pop("model", None)
            base = {"model": model, **base}
        if no_think:
            base = merge_patch(base, {"chat_template_kwargs": {"enable_thinking": False}})
        if think_budget is not None:
            # vLLM enforces `thinking_token_budget`; Qwen3's chat template reads `thinking_budget`
            # (SGLang passes it through). Each server ignores the field it does not know.
            base = merge_patch(
                base,
                {
                    "thinking_token_budget": think_budget,
                    "chat_template_kwargs": {"thinking_budget": think_budget},
                },
            )
        self.schema_name = schema_name
        self.schema = None if schema is None else checked_schema(as_schema(schema), "schema")
        if self.schema is not None:
            try:
                with_schema(url, {}, self.schema, name=schema_name)
            except SchemaError as exc:
                raise UsageError(f"schema: {exc}") from None
        self.path = os.fspath(path)
        check_output(self.path, inputs)  # the files the rows come from are never written over
        self.url = url
        self.force = force
        self.samples, self.greedy_first, self.sample_sep = samples, greedy_first, sample_sep
        self.first_sample = first_sample
        # appended to the last user message: a prompt suffix such as " /no_think"
        self.suffix = (suffix or "") + (f" {NO_THINK_SUFFIX}" if no_think_suffix else "")
        self._base = base
        self._seen: dict[str, int] = {}  # id -> number of the prompt that wrote it
        self._prompts = self._requests = self._chars = self._images = self._uncounted = 0
        self._refuse_overwrite()
        self._file: IO[bytes] | None
        self._file, self._tmp = self._open_temp()

    @property
    def defaults(self) -> dict[str, Any]:
        """The body fields every request gets (model, --param, ...), before a prompt's own."""
        return self._base

    # -- writing ---------------------------------------------------------------------------

    def add(
        self,
        custom_id: str,
        messages_or_prompt: str | list[Any],
        *,
        schema: SchemaLike | None = None,
        **body_overrides: Any,
    ) -> list[str]:
        """Write the request(s) for one prompt; return their custom_ids.

        A string is the user message (chat) or the prompt/input; a list is the chat messages
        (or a list prompt/input for the other endpoints). `None` in the overrides removes
        a default. `schema` replaces the writer's schema for this prompt (a JSON Schema, a
        JSON string of one, or a Pydantic model)."""
        if self._file is None:
            raise OutputError(f"{self.path}: the writer is closed")
        if not isinstance(custom_id, str) or not custom_id:
            raise RequestError(str(custom_id), [("custom_id", "must be a non-empty string")])
        payload = self._payload(custom_id, messages_or_prompt)
        body = merge_patch(self._base, body_overrides)
        body.update(payload)
        if self.url == RESPONSES_URL and "max_tokens" in body:  # the Responses API's name
            body["max_output_tokens"] = body.pop("max_tokens")
        body = self._with_schema(custom_id, body, schema)
        requests = self._expand(custom_id, body)
        ids = [cid for cid, _ in requests]
        for cid in ids:
            earlier = self._seen.get(cid)
            if earlier is not None:
                message = f"{cid!r} repeats the id of prompt {earlier + 1} (in writing order)"
                raise RequestError(cid, [("custom_id", message)], repeats=earlier)
        # Samples differ only in custom_id suffix, seed, temperature and n, none of which the
        # check looks at: checking the first request checks them all.
        first_id, first_body = requests[0]
        problems = check_request({"custom_id": first_id, "url": self.url, "body": first_body})
        problems = problems or check_declared(self.url, first_body)
        if problems:
            raise RequestError(first_id, problems)
        lines = []
        for cid, request_body in requests:
            try:
                lines.append(request_line(cid, request_body, self.url))
            except orjson.JSONEncodeError as exc:
                raise RequestError(cid, [("body", f"not JSON-serializable: {exc}")]) from None
        self._file.write(b"".join(lines))
        self._seen.update(dict.fromkeys(ids, self._prompts))
        self._prompts += 1
        self._requests += len(lines)
        self._chars += _text_chars(payload) * len(lines)
        images, uncounted, files = image_tokens(first_body)
        self._images += images * len(lines)
        self._uncounted += (uncounted + files) * len(lines)
        return ids

    def _with_schema(
        self, custom_id: str, body: dict[str, Any], schema: SchemaLike | None
    ) -> dict[str, Any]:
        try:
            if schema is not None:
                schema = row_schema(as_schema(schema) if isinstance(schema, type) else schema)
            schema = schema if schema is not None else self.schema
            if schema is None:
                return body
            return with_schema(
                self.url, body, schema, name=self.schema_name, strict=strict_ok(schema)
            )
        except SchemaError as exc:
            raise RequestError(custom_id, [(exc.field or "schema", str(exc))]) from None

    def _payload(self, custom_id: str, prompt: str | list[Any]) -> dict[str, Any]:
        field = PROMPT_FIELDS[self.url]
        if self.url not in CHAT_LIKE:
            is_chat = isinstance(prompt, list) and any(isinstance(m, dict) for m in prompt)
            if is_chat or not isinstance(prompt, (str, list)):
                msg = f"{self.url} takes a string or a list of strings, not chat messages"
                raise RequestError(custom_id, [(f"body.{field}", msg)])
            return {field: prompt}
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.suffix:
            messages = _with_suffix(custom_id, messages, self.suffix)
        if self.url == RESPONSES_URL and isinstance(prompt, str) and not self.suffix:
            return {field: prompt}
        if self.url == MESSAGES_URL:  # Anthropic takes the system prompt beside the messages
            system = [m for m in messages if isinstance(m, dict) and m.get("role") == "system"]
            rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
            if system:
                text = "\n\n".join(str(m.get("content") or "") for m in system)
                return {"system": text, field: rest}
            return {field: rest}
        return {field: messages}

    def _expand(self, custom_id: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        if self.samples is None:
            return [(custom_id, body)]
        out = []
        for k in range(self.first_sample, self.first_sample + self.samples):
            sample = dict(body)
            if isinstance(body.get("seed"), int):
                sample["seed"] = body["seed"] + k
            if k == 0 and self.greedy_first:
                sample["temperature"] = 0
                sample.pop("n", None)  # n greedy choices would all be the same
            out.append((f"{custom_id}{self.sample_sep}{k}", sample))
        return out

    # -- the file --------------------------------------------------------------------------

    def _refuse_overwrite(self) -> None:
        if not self.force and os.path.lexists(self.path):
            raise OutputError(f"{self.path} exists; refusing to overwrite it (--force replaces it)")

    def _open_temp(self) -> tuple[IO[bytes], str]:
        # beside the real file: a symbolic link given as -o is written through, not replaced
        directory, name = os.path.split(os.path.realpath(self.path))
        try:
            os.makedirs(directory, exist_ok=True)  # as exec does for its output
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror}") from None
        return os.fdopen(fd, "wb", buffering=1 << 20), tmp

    def close(self) -> GenSummary:
        """Finish the file and move it into place."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.flush()
                os.fsync(file.fileno())
                file.close()
                os.chmod(self._tmp, 0o644)  # mkstemp's 0600 would surprise whoever reads it next
                self._refuse_overwrite()  # it may have appeared while we wrote
                os.replace(self._tmp, os.path.realpath(self.path))
            except OSError as exc:
                Path(self._tmp).unlink(missing_ok=True)
                raise OutputError(f"cannot write {self.path}: {exc.strerror}") from None
            except BaseException:
                Path(self._tmp).unlink(missing_ok=True)
                raise
        return self.summary

    def abort(self) -> None:
        """Drop what was written; the target is left as it was."""
        if self._file is not None:
            file, self._file = self._file, None
            file.close()
            Path(self._tmp).unlink(missing_ok=True)

    @property
    def summary(self) -> GenSummary:
        return GenSummary(
            self.path, self._prompts, self._requests, self._chars, self._images, self._uncounted
        )

    def __enter__(self) -> RequestWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _check_options(
    url: str,
    samples: int | None,
    greedy_first: bool,
    sample_sep: str,
    first_sample: int,
    no_think: bool,
    no_think_suffix: bool,
    think_budget: int | None,
) -> None:
    if samples is not None and samples < 1:
        raise UsageError(f"samples must be >= 1, got {samples}")
    if greedy_first and samples is None:
        raise UsageError("greedy-first needs samples (--samples K)")
    if type(first_sample) is not int or first_sample < 0:
        raise UsageError(f"first sample must be an integer >= 0, got {first_sample!r}")
    if first_sample and samples is None:
        raise UsageError("first-sample needs samples (--samples K)")
    if first_sample and greedy_first:
        raise UsageError(
            f"greedy-first makes sample 0 greedy, but samples start at {first_sample}: "
            "Agentless's --skip_greedy (samples from 1) means no greedy sample, so leave out "
            "--greedy-first"
        )
    if not sample_sep:
        raise UsageError("the sample separator must not be empty")
    if think_budget is not None and think_budget < 0:
        raise UsageError(f"think budget must be >= 0, got {think_budget}")
    if url != CHAT_URL and (no_think or no_think_suffix or think_budget is not None):
        raise UsageError(f"the thinking switches and suffixes apply to {CHAT_URL} only, not {url}")
    if url == EMBEDDINGS_URL and samples is not None:
        raise UsageError(f"samples make no sense for {url}: embeddings are deterministic")


def _with_suffix(custom_id: str, messages: list[Any], suffix: str) -> list[Any]:
    """A copy of `messages` whose last user message ends with `suffix` (a text part of its own,
    spaces trimmed, for multi-part content)."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                content = f"{content}{suffix}"
            elif isinstance(content, list):
                content = [*content, {"type": "text", "text": suffix.strip()}]
            return [*messages[:i], {**message, "content": content}, *messages[i + 1 :]]
    raise RequestError(
        custom_id, [("body.messages", f"no user message to append {suffix.strip()!r} to")]
    )


def _text_chars(value: Any) -> int:
    """Characters of prompt text in a payload: message contents and text parts, not images."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(
            _text_chars(value.get(k))
            for k in ("system", "messages", "prompt", "input", "content", "text")
        )
    return 0
