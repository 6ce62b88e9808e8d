"""`jsonlbatch gen`: a dataset and a prompt template in, an OpenAI Batch request file out."""

from __future__ import annotations

from typing import Any

import click

from jsonlbatch.batch_format.records import CHAT_URL
from jsonlbatch.cli.params import Finite, NonEmpty
from jsonlbatch.cli.sections import Section, Sectioned
from jsonlbatch.errors import UsageError
from jsonlbatch.gen.body_fields import load_body_file, merge_patch, parse_param
from jsonlbatch.gen.response_rows import looks_like_responses, response_rows
from jsonlbatch.gen.row_requests import write_requests
from jsonlbatch.gen.schemas import load_schema
from jsonlbatch.gen.sources import FORMATS, iter_rows, select
from jsonlbatch.gen.templates import Prompt, RowTemplate, compile_condition
from jsonlbatch.gen.writer import CHARS_PER_TOKEN, PROMPT_FIELDS, RequestWriter
from jsonlbatch.stats import plural

_SECTIONS: list[Section] = [
    ("Rows", ("data", "responses", "requests_file", "join", "join_on", "per", "continues",
              "fmt", "where", "limit", "sample")),
    ("Prompt", ("template", "prompt_text", "messages", "system", "id_template")),
    ("Request body", ("model", "url", "n", "samples", "greedy_first", "sample_sep",
                      "first_sample", "temperature", "top_p", "top_k", "min_p", "max_tokens",
                      "seed", "stop",
                      "param", "body_file", "no_think", "no_think_suffix", "suffix",
                      "think_budget")),
    ("Structured output", ("schema_spec", "schema_field", "schema_name")),
    ("Output", ("output", "force")),
]  # fmt: skip
_EXAMPLES = (
    "jsonlbatch gen --data tasks.jsonl --prompt '{{ question }}' --model Qwen/Qwen3-8B \\",
    "    --samples 8 --temperature 0.7 --max-tokens 4096 -o requests.jsonl",
    "jsonlbatch gen --data tasks.csv --template prompt.j2 --model M -o requests.jsonl",
    "jsonlbatch gen --responses responses.jsonl --prompt 'Check: {{ answer }}' --model judge \\",
    "    -o judge-requests.jsonl                         # a judge round over the answers",
)


@click.command("gen", cls=Sectioned, sections=_SECTIONS, examples=_EXAMPLES)
@click.option(
    "-d",
    "--data",
    help="Rows: .jsonl, .json (a list), .csv, .parquet, or - for stdin; a response file is "
    "read as responses (see --responses).",
)
@click.option(
    "--responses",
    type=click.Path(dir_okay=False),
    help="Rows from a response file: custom_id, group, sample, answer, reasoning, "
    "finish_reason, usage, failed, ... (docs/gen.md).",
)
@click.option(
    "--requests",
    "requests_file",
    type=click.Path(dir_okay=False),
    help="With responses: the request file, adding messages, body and conversation.",
)
@click.option(
    "--join",
    type=click.Path(dir_okay=False),
    help="With responses: a data file whose row (matched by --on) is added to each response.",
)
@click.option(
    "--on", "join_on", metavar="FIELD", help="The --join file's field equal to the group id."
)
@click.option(
    "--per",
    type=click.Choice(["request", "choice"]),
    default="request",
    show_default=True,
    help="With responses: one row per response line or per choice.",
)
@click.option(
    "--continue",
    "continues",
    is_flag=True,
    help="The template is a new user turn after the request's messages and the answer "
    "(needs --requests).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    help="Data format, when the suffix does not say (stdin: jsonl).",
)
@click.option(
    "--template", type=click.Path(dir_okay=False), help="Jinja2 file rendering the user message."
)
@click.option("--prompt", "prompt_text", help="Inline Jinja2 user message (\\n, \\t understood).")
@click.option(
    "--messages",
    type=click.Path(dir_okay=False),
    help="Jinja2 file rendering a JSON list of chat messages; a local picture or PDF goes in "
    "as {{ path | image_part | tojson }} or {{ path | file_part | tojson }} (docs/gen.md).",
)
@click.option("--system", help="Inline Jinja2 system message, before the user message.")
@click.option("--id", "id_template", help="Jinja2 custom_id per row [default: the row's index].")
@click.option(
    "--model",
    type=NonEmpty(),
    help='Model name for every request, or a Jinja2 template per row, e.g. "{{ model }}".',
)
@click.option(
    "--url",
    type=click.Choice(list(PROMPT_FIELDS)),
    default=CHAT_URL,
    show_default=True,
    help="Endpoint; sets the body shape.",
)
@click.option(
    "--where",
    multiple=True,
    help="Keep rows where this Jinja2 expression is true, e.g. \"split == 'test'\". Repeatable (all must hold).",
)
@click.option("--limit", type=click.IntRange(min=0), help="Read at most N matching rows.")
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    help="Draw K of the matching rows at random (seeded by --seed, else 0).",
)
@click.option(
    "--n",
    type=click.IntRange(min=1),
    help="K choices in one request (body.n): one call, prompt prefilled once.",
)
@click.option("--samples", type=click.IntRange(min=1), help="K requests per row, named <id>|<k>.")
@click.option("--greedy-first", is_flag=True, help="Sample 0 at temperature 0 (with --samples).")
@click.option(
    "--sample-sep",
    type=NonEmpty(),
    default="|",
    show_default=True,
    help="Separator of <id> and <k> in sample ids.",
)
@click.option(
    "--first-sample",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Number of the first sample: 1 writes <id>|1..<id>|K, as Agentless --skip_greedy.",
)
@click.option("--temperature", type=Finite(min=0))
@click.option("--top-p", type=Finite(min=0, max=1))
@click.option("--top-k", type=int)
@click.option("--min-p", type=Finite(min=0, max=1))
@click.option("--max-tokens", type=click.IntRange(min=1))
@click.option("--seed", type=int, help="body.seed (seed + k for sample k); also seeds --sample.")
@click.option("--stop", multiple=True, help="Stop string. Repeatable.")
@click.option(
    "--param",
    multiple=True,
    metavar="KEY=JSON",
    help="Any body field, e.g. repetition_penalty=1.05 or chat_template_kwargs.thinking=true. Repeatable.",
)
@click.option(
    "--body-file",
    type=click.Path(dir_okay=False),
    help="JSON object of body fields; options override it.",
)
@click.option("--no-think", is_flag=True, help="chat_template_kwargs.enable_thinking=false.")
@click.option("--no-think-suffix", is_flag=True, help="Append /no_think to the last user message.")
@click.option("--suffix", help="Text appended to the last user message, e.g. ' /no_think'.")
@click.option(
    "--think-budget",
    type=click.IntRange(min=0),
    help="Cap on thinking tokens (thinking_token_budget, chat_template_kwargs.thinking_budget).",
)
@click.option(
    "--schema",
    "schema_spec",
    metavar="FILE.json|module:Model",
    help="The answer's JSON Schema (a file, or a Pydantic model), written as the endpoint's "
    "response_format; exec checks every answer against it.",
)
@click.option(
    "--schema-field",
    metavar="FIELD",
    help="A data column holding each row's schema (an object or a JSON string; empty: --schema).",
)
@click.option(
    "--schema-name",
    default="answer",
    show_default=True,
    help="The schema's name in the request ([a-zA-Z0-9_-], at most 64).",
)
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="Request JSONL to write."
)
@click.option("--force", is_flag=True, help="Replace the output file if it exists.")
def gen(
    data: str | None,
    responses: str | None,
    requests_file: str | None,
    join: str | None,
    join_on: str | None,
    per: str,
    continues: bool,
    fmt: str | None,
    template: str | None,
    prompt_text: str | None,
    messages: str | None,
    system: str | None,
    id_template: str | None,
    model: str | None,
    url: str,
    where: tuple[str, ...],
    limit: int | None,
    sample: int | None,
    n: int | None,
    samples: int | None,
    greedy_first: bool,
    sample_sep: str,
    first_sample: int,
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    min_p: float | None,
    max_tokens: int | None,
    seed: int | None,
    stop: tuple[str, ...],
    param: tuple[str, ...],
    body_file: str | None,
    no_think: bool,
    no_think_suffix: bool,
    suffix: str | None,
    think_budget: int | None,
    schema_spec: str | None,
    schema_field: str | None,
    schema_name: str,
    output: str,
    force: bool,
) -> None:
    """Write an OpenAI Batch request file: one request per data row (or --samples per row).

    The rows may be a response file (--responses, or --data naming one): a second turn, a
    self-check or a judge prompt over the answers of a run.
    """
    if (data is None) == (responses is None):
        raise UsageError("give exactly one of --data or --responses")
    if responses is None and data is not None and fmt in (None, "jsonl"):
        responses = data if looks_like_responses(data) else None
    if responses is None and (requests_file or join or join_on or continues or per != "request"):
        raise UsageError("--requests, --join, --on, --per and --continue read a response file")
    if continues and requests_file is None:
        raise UsageError("--continue needs --requests (the conversation so far)")
    if sum(x is not None for x in (template, prompt_text, messages)) != 1:
        raise UsageError("give exactly one of --template, --prompt or --messages")
    if template is not None:
        user = RowTemplate.from_file(template)
    elif prompt_text is not None:
        user = RowTemplate.inline(
            prompt_text, name="--prompt", instead=f"use --template {prompt_text}"
        )
    else:
        user = None
    prompt = Prompt(
        user=user,
        messages=RowTemplate.from_file(messages) if messages else None,
        system=RowTemplate.inline(
            system, name="--system", instead="give its text, or a --messages template"
        )
        if system is not None
        else None,
        continues=continues,
    )
    custom_id = RowTemplate.inline(id_template, name="--id") if id_template else None
    # a model with template syntax is rendered per row: a fleet's requests in one file
    model_of_row = None
    if model is not None and ("{{" in model or "{%" in model):
        model_of_row, model = RowTemplate.inline(model, name="--model"), None
    condition = compile_condition(" and ".join(f"({w})" for w in where)) if where else None

    options: dict[str, Any] = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
    }
    options |= {"max_tokens": max_tokens, "n": n, "seed": seed, "stop": list(stop) or None}
    body = load_body_file(body_file) if body_file else {}
    body = merge_patch(body, {k: v for k, v in options.items() if v is not None})
    for p in param:
        body = merge_patch(body, parse_param(p))

    source = (
        response_rows(responses, requests=requests_file, join=join, on=join_on, per=per)
        if responses is not None
        else iter_rows(data or "-", fmt)
    )
    rows = select(source, where=condition, limit=limit, sample=sample, seed=seed or 0)
    with RequestWriter(
        output,
        model=model,
        url=url,
        force=force,
        samples=samples,
        greedy_first=greedy_first,
        sample_sep=sample_sep,
        first_sample=first_sample,
        no_think=no_think,
        no_think_suffix=no_think_suffix,
        think_budget=think_budget,
        body=body,
        suffix=suffix,
        inputs=(data, responses, requests_file, join, template, messages, body_file, schema_spec),
        schema=load_schema(schema_spec) if schema_spec else None,
        schema_name=schema_name,
    ) as writer:
        write_requests(rows, writer, prompt, custom_id=custom_id, schema_field=schema_field,
                       model=model_of_row)  # fmt: skip
    s = writer.summary
    per = f" ({plural(s.prompts, 'row')} x {plural(samples, 'sample')})" if samples else ""
    click.echo(
        f"wrote {plural(s.requests, 'request')}{per} to {s.path}; about "
        f"{plural(s.prompt_tokens_estimate, 'prompt token')}"
        f" (estimated as characters / {CHARS_PER_TOKEN}, no tokenizer"
        + (f"; {s.image_tokens:,} of them image tokens, as billed" if s.image_tokens else "")
        + ")"
        + (f"; {s.uncounted_media:,} image/file parts not counted" if s.uncounted_media else ""),
        err=True,
    )
    if s.requests == 0:
        click.echo("warning: no row got through; check --where, --limit and the data", err=True)
