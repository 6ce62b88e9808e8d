"""Images and files in a request line, as the viewer shows them: a short description of each
media part in the detail, and the decoded bytes of one image on demand.

A request line with pictures is mostly base64. The detail never sends it to the page: each
image part becomes a link to `/api/media`, which reads that one line again by its offset,
decodes that one part and answers its bytes, with the type its first bytes say (PNG, JPEG, GIF,
WebP; anything else is refused, so an SVG or HTML page can never be served from the viewer's
origin) and no more than `MAX_IMAGE_BYTES`. Parts are found in every shape a request file may
hold: chat `image_url` / `file`, Responses `input_image` / `input_file`, Anthropic `image` /
`document` blocks.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

from jsonlbatch.batch_format.media import IMAGE_TYPES, sniff, split_data_url
from jsonlbatch.errors import UsageError

#: The most decoded bytes one image answer holds (a provider's own cap on a request is 20-32 MB).
MAX_IMAGE_BYTES = 32 * 1000 * 1000


@dataclass(frozen=True, slots=True)
class Source:
    """Where a media part's bytes are: base64 text (from a `data:` URL or a base64 source) or
    a remote URL (never fetched by the viewer)."""

    kind: str  # "image" | "file"
    mime: str | None
    data: str | None = None
    url: str | None = None
    filename: str | None = None

    @property
    def size(self) -> int:
        """Decoded bytes, from the base64 text's length (padding aside)."""
        if self.data is None:
            return 0
        return len(self.data) * 3 // 4 - self.data[-2:].count("=")


def _from_url(kind: str, url: Any, filename: Any = None) -> Source | None:
    if not isinstance(url, str):
        return None
    name = filename if isinstance(filename, str) else None
    if url[:5].lower() == "data:":
        parts = split_data_url(url)
        if parts is None:  # not base64: shown by its type, never decoded
            return Source(kind, url[5:].partition(",")[0].split(";")[0] or None, filename=name)
        return Source(kind, parts[0] or None, data=parts[1], filename=name)
    return Source(kind, None, url=url, filename=name)


def part_source(part: Any) -> Source | None:
    """The media in one content part of any API's shape, or None for a text (or unknown)
    part."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind in ("image_url", "input_image"):
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        return _from_url("image", url)
    if kind == "file":
        inner = part.get("file")
        if isinstance(inner, dict):
            return _from_url("file", inner.get("file_data"), inner.get("filename"))
        return None
    if kind == "input_file":
        return _from_url(
            "file", part.get("file_data") or part.get("file_url"), part.get("filename")
        )
    if kind in ("image", "document"):
        source = part.get("source")
        if not isinstance(source, dict):
            return None
        block = "image" if kind == "image" else "file"
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            mime = source.get("media_type") if isinstance(source.get("media_type"), str) else None
            return Source(block, mime, data=source["data"])
        if source.get("type") == "url":
            return _from_url(block, source.get("url"))
    return None


def describe_source(source: Source) -> dict[str, Any]:
    """What the detail says of a part: its kind, type, size, and a remote URL as text."""
    out: dict[str, Any] = {"kind": source.kind, "mime": source.mime, "bytes": source.size}
    if source.url is not None:
        out["url"] = source.url
    if source.filename:
        out["filename"] = source.filename
    return out


def media_at(body: Any, message: int, part: int) -> Source:
    """The media part `part` of message `message` of a request body (an Anthropic `system`
    never holds one); a `UsageError` naming what is not there."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        messages = body.get("input") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not 0 <= message < len(messages):
        raise UsageError(f"message: the request has no message {message}")
    content = messages[message].get("content") if isinstance(messages[message], dict) else None
    if not isinstance(content, list) or not 0 <= part < len(content):
        raise UsageError(f"part: message {message} has no part {part}")
    found = part_source(content[part])
    if found is None:
        raise UsageError(f"part: part {part} of message {message} is no image or file")
    return found


def image_bytes(source: Source) -> tuple[bytes, str]:
    """The decoded bytes of an image part and their type; a `UsageError` for a remote image, a
    file, one over `MAX_IMAGE_BYTES`, base64 that does not decode, or bytes that are no image
    the viewer shows."""
    if source.data is None:
        raise UsageError("part: a remote image is not fetched by the viewer: open its URL")
    if source.size > MAX_IMAGE_BYTES:
        raise UsageError(f"part: an image of {source.size:,} bytes, over the {MAX_IMAGE_BYTES:,} "
                         "the viewer serves")  # fmt: skip
    try:
        data = binascii.a2b_base64(source.data)  # lenient: what it is made of is sniffed next
    except (binascii.Error, ValueError) as exc:
        raise UsageError(f"part: its base64 does not decode ({exc})") from None
    mime = sniff(data[:16])
    if mime not in IMAGE_TYPES:  # a PDF (or anything else) is never served as a picture
        raise UsageError("part: its bytes are not a PNG, JPEG, GIF or WebP image")
    return data, mime
