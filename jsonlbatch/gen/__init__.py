"""The gen stage: rows of data and a prompt template in, an OpenAI Batch request file out.

`sources` streams rows from JSONL, JSON, CSV, Parquet or stdin (filtered and sampled), and
`responses` the rows of a response file (answers, reasoning, usage, the request, a data row);
`templates` renders each row into messages with sandboxed Jinja2; `writer` turns messages and
sampling options into request lines (`RequestWriter`), the same machinery `jsonlbatch gen` uses;
`row_requests` feeds it a source's rows (`write_requests`), `body_fields` the fields every body
starts from.

    from jsonlbatch.gen import RequestWriter
    with RequestWriter("requests.jsonl", model="Qwen/Qwen3-8B") as w:
        w.add("q1", [{"role": "user", "content": "2+2?"}], n=3)
        w.add("q2", [{"role": "user", "content": [
            {"type": "text", "text": "What is in the picture?"}, image_part("cat.jpg")]}])
"""

from __future__ import annotations

from jsonlbatch.gen.data_urls import MediaError, data_url, file_part, image_part
from jsonlbatch.gen.response_rows import response_rows
from jsonlbatch.gen.row_requests import write_requests
from jsonlbatch.gen.writer import GenSummary, RequestError, RequestWriter

__all__ = [
    "GenSummary",
    "MediaError",
    "RequestError",
    "RequestWriter",
    "data_url",
    "file_part",
    "image_part",
    "response_rows",
    "write_requests",
]
