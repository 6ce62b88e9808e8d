"""Images and files in a chat request, read once for every translation to another provider.

OpenAI's chat parts carry media two ways: `image_url` (a `data:` URL with the bytes in base64,
or a remote URL) and `file` (`file_data`, a `data:` URL, with a `filename`). Anthropic and
Gemini take the same bytes in their own blocks (Anthropic's base64 `image`/`document` sources,
Gemini's `inlineData`), so a `data:` URL moves across as its MIME type and base64 text,
unchanged and never decoded into memory beyond a check that it decodes. A remote URL moves as a
URL where the provider fetches URLs (Anthropic's `url` source; Gemini only for its own Files API
URIs and `gs://`); elsewhere it is refused, naming the line, before anything is submitted.
"""

from __future__ import annotations

import mimetypes
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from jsonlbatch.batch_format.media import base64_problem

Problems = list[tuple[str, str]]

_DATA_URL = re.compile(r"data:([A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+)((?:;[^;,]*)*?);base64,", re.A)
#: Gemini's `fileData.fileUri`: a Files API URI or a Cloud Storage object.
_GEMINI_FILE_HOST = "generativelanguage.googleapis.com"


@dataclass(frozen=True, slots=True)
class Media:
    """One image or file part: its bytes as base64 (from a `data:` URL) or a remote URL."""

    kind: str  # "image" | "file"
    mime: str | None
    where: str  # the part's field, for a problem a provider finds later
    data: str | None = None  # base64 text, checked to decode
    url: str | None = None
    filename: str | None = None

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{self.data}"


def parse_data_url(url: str, where: str, problems: Problems) -> tuple[str, str] | None:
    """(MIME type, base64 text) of a base64 `data:` URL; a problem when it is not one or its
    base64 does not decode (checked strictly, without decoding it)."""
    found = _DATA_URL.match(url)
    if found is None:
        problems.append((where, "a data: URL must be data:<type>/<subtype>;base64,<data>"))
        return None
    payload = url[found.end() :]
    problem = base64_problem(payload)
    if problem is not None:
        problems.append((where, f"the data: URL's {problem.removeprefix('the ')}"))
        return None
    return found.group(1).lower(), payload


def media_of_part(part: dict[str, Any], where: str, problems: Problems) -> Media | None:
    """An `image_url` or `file` part as `Media` (None, with a problem, when it is unusable)."""
    kind = part.get("type")
    if kind == "image_url":
        inner = part.get("image_url")
        url = inner.get("url") if isinstance(inner, dict) else inner
        if not isinstance(url, str) or not url:
            problems.append((f"{where}.image_url.url", "must be a URL string"))
            return None
        if url.startswith("data:"):
            parsed = parse_data_url(url, f"{where}.image_url.url", problems)
            return None if parsed is None else Media("image", parsed[0], where, data=parsed[1])
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        if scheme not in ("http", "https", "gs"):
            problems.append(
                (f"{where}.image_url.url", "must be an https:// URL or a data: URL, "
                 f"not {url[:60]!r} (gen's data_url filter embeds a local file)")
            )  # fmt: skip
            return None
        return Media("image", _guess_type(url), where, url=url)
    inner = part.get("file")
    if not isinstance(inner, dict):
        problems.append((f"{where}.file", "must be an object"))
        return None
    filename = inner.get("filename") if isinstance(inner.get("filename"), str) else None
    if isinstance(inner.get("file_data"), str):
        parsed = parse_data_url(inner["file_data"], f"{where}.file.file_data", problems)
        if parsed is None:
            return None
        return Media("file", parsed[0], where, data=parsed[1], filename=filename)
    if "file_id" in inner:
        problems.append((f"{where}.file.file_id", "an OpenAI file id is not translated: put "
                         "the file's bytes in file_data (a data: URL)"))  # fmt: skip
        return None
    problems.append((f"{where}.file", "file_data (a data: URL) is needed"))
    return None


def _guess_type(url: str) -> str | None:
    return mimetypes.guess_type(urllib.parse.urlsplit(url).path)[0]


# -- Anthropic --------------------------------------------------------------------------------

#: The image types Anthropic's `image` block takes.
ANTHROPIC_IMAGES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def anthropic_block(media: Media, problems: Problems) -> dict[str, Any] | None:
    """A Messages content block for `media`: `image` or `document`, base64 or url source."""
    where = media.where
    if media.url is not None:
        if not media.url.lower().startswith(("https://", "http://")):
            problems.append((where, f"Anthropic fetches http(s) URLs only, not {media.url[:60]!r}"))
            return None
        block = "image" if media.kind == "image" else "document"
        return {"type": block, "source": {"type": "url", "url": media.url}}
    if media.kind == "image" or (media.mime or "").startswith("image/"):
        if media.mime not in ANTHROPIC_IMAGES:
            problems.append((where, f"Anthropic takes images as {', '.join(sorted(ANTHROPIC_IMAGES))}, "
                             f"not {media.mime}"))  # fmt: skip
            return None
        source = {"type": "base64", "media_type": media.mime, "data": media.data}
        return {"type": "image", "source": source}
    if media.mime == "application/pdf":
        source = {"type": "base64", "media_type": "application/pdf", "data": media.data}
        return {"type": "document", "source": source}
    problems.append((where, f"Anthropic takes files as PDF documents, not {media.mime}"))
    return None


# -- Gemini -------------------------------------------------------------------------------------


def gemini_part(media: Media, problems: Problems) -> dict[str, Any] | None:
    """A Gemini part for `media`: `inlineData` for bytes, `fileData` for a URI Gemini reads
    (its Files API, `gs://`); any other URL is refused: Gemini does not fetch it."""
    where = media.where
    if media.data is not None:
        return {"inlineData": {"mimeType": media.mime, "data": media.data}}
    url = media.url or ""
    split = urllib.parse.urlsplit(url)
    if split.scheme == "gs" or (
        split.scheme == "https" and split.hostname == _GEMINI_FILE_HOST and "/files/" in split.path
    ):
        data: dict[str, Any] = {"fileUri": url}
        if media.mime:
            data["mimeType"] = media.mime
        return {"fileData": data}
    problems.append(
        (where, f"Gemini's batch takes an image as inline data or a Files API / gs:// URI, not "
         f"{url[:60]!r}: embed it as a data: URL (gen's data_url filter)")
    )  # fmt: skip
    return None


_URL_SAFE = str.maketrans("-_", "+/")


def standard_base64(text: str) -> str:
    """Base64 in the standard alphabet, padded: protobuf's JSON (and so google-genai, which
    sends bytes URL-safe) takes either alphabet and no padding; a `data:` URL wants these."""
    text = text.translate(_URL_SAFE)
    return text + "=" * (-len(text) % 4)


def gemini_to_part(part: dict[str, Any]) -> dict[str, Any] | None:
    """A Gemini `inlineData` / `fileData` part as an OpenAI chat part (None: not one)."""
    inline = part.get("inlineData") or part.get("inline_data")
    if isinstance(inline, dict):
        mime = str(inline.get("mimeType") or inline.get("mime_type") or "")
        url = f"data:{mime};base64,{standard_base64(str(inline.get('data') or ''))}"
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"filename": "file", "file_data": url}}
    uri = part.get("fileData") or part.get("file_data")
    if isinstance(uri, dict):
        return {
            "type": "image_url",
            "image_url": {"url": str(uri.get("fileUri") or uri.get("file_uri"))},
        }
    return None
