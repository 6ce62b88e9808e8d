"""Pictures and files inside requests: what kind a file is, how big a picture is, whether a
`data:` URL holds valid base64, and where a request's media parts are.

Shared by gen (embedding local files), exec's input scan and `validate` (refusing a part no
server takes), the token estimate in `cost` (images billed by their size) and the mock (the
same count in its usage). Everything here reads headers only: a picture's width and height
come from its first bytes (PNG's IHDR, JPEG's SOF marker, GIF's screen descriptor, WebP's VP8
chunks), decoded out of base64 a window at a time, so a 10 MB image costs a few kilobytes of
work and a broken one costs no more. Pure Python, every loop bounded.
"""

from __future__ import annotations

import binascii
import re
import struct
from collections.abc import Callable, Iterator
from typing import Any

#: The kinds of file a request may carry, by their first bytes (never by their name).
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)
#: The image types the providers take in an image part.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
KNOWN_TYPES = "PNG, JPEG, GIF, WebP or PDF"

_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_B64_STRAY = re.compile(r"[^A-Za-z0-9+/]")
#: What a stray character most likely means, said after it.
_B64_HINTS = {
    **dict.fromkeys(
        "\n\r \t", ": base64 wrapped in lines (as email tools write it) must be one run"
    ),
    **dict.fromkeys("-_", ": URL-safe base64; a data: URL takes the standard alphabet (+ and /)"),
}
_JPEG_SCAN_LIMIT = 1 << 24  # a SOF marker further in than 16 MB: not sized
_JPEG_SEGMENTS = 4096
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def sniff(head: bytes) -> str | None:
    """The MIME type the first bytes of a file say (at least 12 of them), or None."""
    for magic, mime in _MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


# -- base64 and data: URLs -----------------------------------------------------------------


def split_data_url(url: str) -> tuple[str, str] | None:
    """`data:<mime>[;...];base64,<payload>` -> (mime, payload); None when it is not one."""
    head, comma, payload = url.partition(",")
    if not comma or head[:5].lower() != "data:" or not head.lower().endswith(";base64"):
        return None
    return head[5:].split(";", 1)[0].strip().lower(), payload


def base64_problem(payload: str) -> str | None:
    """Why `payload` is not strict base64 (the standard alphabet, padded to a multiple of 4),
    or None. Nothing is decoded: the alphabet is checked with one `bytes.translate` pass, so a
    25 KB picture costs about 25 us and a multi-MB one milliseconds."""
    if not payload:
        return "the base64 is empty"
    pads = 2 if payload.endswith("==") else 1 if payload.endswith("=") else 0
    if not payload.isascii() or payload.encode("ascii")[: len(payload) - pads].translate(
        None, _B64_ALPHABET
    ):
        at = _B64_STRAY.search(payload, 0, len(payload) - pads)
        where = f"character {payload[at.start()]!r} at {at.start()}" if at else "a stray character"
        stray = payload[at.start()] if at else ""
        return f"the base64 does not decode ({where}){_B64_HINTS.get(stray, '')}"
    if len(payload) % 4:
        return f"the base64 does not decode (its length, {len(payload)}, is not a multiple of 4)"
    return None


def data_url_problem(url: str) -> str | None:
    """Why a `data:` URL cannot be sent, or None."""
    parts = split_data_url(url)
    if parts is None:
        return "a data: URL must be data:<type>;base64,<base64>"
    return base64_problem(parts[1])


def image_url_problem(url: Any) -> str | None:
    """Why an image part's URL reaches no server (a local path, a broken data URL), or None."""
    if not isinstance(url, str):
        return "must be a string (an https:// or a data: URL)"
    scheme = url[:8].lower()
    if scheme.startswith(("http://", "https://")):
        return None
    if scheme.startswith("data:"):
        return data_url_problem(url)
    shown = url if len(url) <= 60 else url[:57] + "..."
    return (
        f"must be an http(s):// or a data: URL, got {shown!r} (a server cannot read a local "
        "path: embed the file with gen's data_url filter)"
    )


class Base64Bytes:
    """Random access to the bytes a base64 text encodes, decoding only the windows asked for
    (4 characters hold 3 bytes, so any byte range maps onto a character range)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.size = len(text) // 4 * 3  # an upper bound: padding makes it up to 2 less

    def __call__(self, offset: int, count: int) -> bytes:
        start = offset // 3 * 4
        stop = min(len(self.text), -(-(offset + count) // 3) * 4)
        if start >= stop:
            return b""
        try:
            data = binascii.a2b_base64(self.text[start:stop])
        except (binascii.Error, ValueError):
            return b""
        skip = offset - offset // 3 * 3
        return data[skip : skip + count]


Reader = Callable[[int, int], bytes]


def bytes_reader(data: bytes) -> Reader:
    """`Reader` over bytes in memory."""
    return lambda offset, count: data[offset : offset + count]


# -- picture sizes from headers --------------------------------------------------------------


def image_size(read: Reader) -> tuple[int, int] | None:
    """(width, height) from a PNG, JPEG, GIF or WebP header, or None when it cannot be read.
    `read(offset, count)` returns the file's bytes there (fewer at its end)."""
    head = read(0, 32)
    mime = sniff(head)
    size: tuple[int, int] | None = None
    if mime == "image/png" and head[12:16] == b"IHDR" and len(head) >= 24:
        size = struct.unpack(">II", head[16:24])
    elif mime == "image/gif" and len(head) >= 10:
        size = struct.unpack("<HH", head[6:10])
    elif mime == "image/webp":
        size = _webp_size(head)
    elif mime == "image/jpeg":
        size = _jpeg_size(read)
    if size is None or not (0 < size[0] <= 1 << 20 and 0 < size[1] <= 1 << 20):
        return None
    return size


def _webp_size(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        b = head[21:25]
        return 1 + (b[0] | (b[1] & 0x3F) << 8), 1 + (b[1] >> 6 | b[2] << 2 | (b[3] & 0xF) << 10)
    if chunk == b"VP8X" and len(head) >= 30:
        return 1 + int.from_bytes(head[24:27], "little"), 1 + int.from_bytes(head[27:30], "little")
    return None


def _jpeg_size(read: Reader) -> tuple[int, int] | None:
    found = _jpeg_marker(read, _SOF)
    if found is None or len(found[1]) < 9:
        return None
    h, w = struct.unpack(">HH", found[1][5:9])
    return w, h


def _jpeg_marker(read: Reader, wanted: frozenset[int]) -> tuple[int, bytes] | None:
    """(offset, first bytes) of the JPEG's first marker in `wanted`, walking the marker
    segments (bounded in count and distance; an EXIF block and its thumbnail are skipped
    whole); None at the end of the headers (the start of scan, unless wanted) or a bad byte."""
    offset = 2
    for _ in range(_JPEG_SEGMENTS):
        if offset > _JPEG_SCAN_LIMIT:
            return None
        head = read(offset, 9)
        if len(head) < 4 or head[0] != 0xFF:
            return None
        marker = head[1]
        if marker in wanted:
            return offset, head
        if marker == 0xFF:  # fill byte
            offset += 1
        elif marker in _NO_LENGTH:
            offset += 2
        elif marker in (0xD9, 0xDA):  # end of image, start of scan: no more headers
            return None
        else:
            offset += 2 + struct.unpack(">H", head[2:4])[0]
    return None


_SOS = frozenset({0xDA})
_PNG_END = b"IEND\xaeB`\x82"


def truncated(data: bytes, mime: str) -> bool:
    """Whether a PNG, JPEG, GIF or WebP file was cut short (a download or copy that stopped): a
    PNG without its IEND chunk, a JPEG without an end marker after its first scan (entropy-coded
    data cannot hold one), a GIF whose last byte (zero padding aside) is not its trailer `;`
    (its compressed data holds that byte anywhere, so it is looked for at the end only), a WebP
    shorter than its RIFF header says. Bytes after the end (a phone's motion photo appends a
    video to its JPEG) are not a cut."""
    if mime == "image/png":
        return _PNG_END not in data
    if mime == "image/jpeg":
        scan = _jpeg_marker(bytes_reader(data), _SOS)
        return scan is None or data.find(b"\xff\xd9", scan[0]) < 0
    if mime == "image/gif":
        return not data.rstrip(b"\0").endswith(b";")
    if mime == "image/webp":
        return len(data) < 8 + int.from_bytes(data[4:8], "little")
    return False


# -- where a request's media parts are -------------------------------------------------------


def media_parts(body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, part) for each picture or file part of a request body: kind is "image" or "file".
    Chat messages (`image_url`, `file`), Responses input (`input_image`, `input_file`) and
    Anthropic Messages (`image`, `document`) parts."""
    for key in ("messages", "input"):
        items = body.get(key)
        if not isinstance(items, list):
            continue
        for item in items:
            content = item.get("content") if isinstance(item, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                kind = _KINDS.get(kind) if type(kind) is str else None  # hostile: a list
                if kind is not None:
                    yield kind, part


_KINDS = {
    "image_url": "image",
    "input_image": "image",
    "image": "image",
    "file": "file",
    "input_file": "file",
    "document": "file",
}


def image_source(part: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(url, base64 payload, detail) of an image part of any of the three shapes: a data URL
    gives its payload, an https URL its url; None where absent."""
    detail = None
    value = part.get("image_url")
    if part.get("type") == "image":  # Anthropic: a source block
        source = part.get("source")
        if isinstance(source, dict):
            if source.get("type") == "base64" and isinstance(source.get("data"), str):
                return None, source["data"], None
            if isinstance(source.get("url"), str):
                return source["url"], None, None
        return None, None, None
    if isinstance(value, dict):
        detail = value.get("detail")
        value = value.get("url")
    else:
        detail = part.get("detail")
    if not isinstance(value, str):
        return None, None, detail if isinstance(detail, str) else None
    parts = split_data_url(value)
    detail = detail if isinstance(detail, str) else None
    return (None, parts[1], detail) if parts is not None else (value, None, detail)


def part_problem(part: dict[str, Any]) -> tuple[str, str] | None:
    """(sub-field, message) when an image or file part cannot be sent (chat, Responses and
    Messages shapes): an image URL that is neither http(s) nor data, or a data URL (or base64
    source) whose base64 does not decode."""
    kind = part.get("type")
    if kind == "image_url":
        value = part.get("image_url")
        if isinstance(value, dict):
            problem = image_url_problem(value.get("url"))
            return ("image_url.url", problem) if problem else None
        problem = image_url_problem(value)
        return ("image_url", problem) if problem else None
    if kind == "file":
        file = part.get("file")
        if not isinstance(file, dict):
            return "file", "must be an object with file_data or file_id"
        data = file.get("file_data")
        if data is None:
            return (
                None
                if isinstance(file.get("file_id"), str)
                else ("file", "no file_data or file_id")
            )
        if not isinstance(data, str):
            return "file.file_data", "must be a data: URL string"
        problem = _file_data_problem(data)
        return ("file.file_data", problem) if problem else None
    if kind == "input_image":  # the Responses API: a URL string, or an uploaded file's id
        url = part.get("image_url")
        if url is None and isinstance(part.get("file_id"), str):
            if part["file_id"].startswith("file://"):  # uploaded only where docs/files.md says
                return "file_id", (
                    "a file:// path is not uploaded for an input_image: embed the picture as a "
                    "data: URL in image_url (gen's data_url filter)"
                )
            return None
        problem = image_url_problem(url)
        return ("image_url", problem) if problem else None
    if kind == "input_file" and isinstance(part.get("file_data"), str):
        problem = _file_data_problem(part["file_data"])
        return ("file_data", problem) if problem else None
    if kind in ("image", "document"):
        source = part.get("source")
        if isinstance(source, dict) and source.get("type") == "base64":
            data = source.get("data")
            problem = base64_problem(data) if isinstance(data, str) else "must be a string"
            return ("source.data", problem) if problem else None
        if isinstance(source, dict) and source.get("type") == "url":
            url = source.get("url")
            if not (isinstance(url, str) and url[:8].lower().startswith(("http://", "https://"))):
                return "source.url", "must be an http(s):// URL"
    return None


def _file_data_problem(data: str) -> str | None:
    """A file part's data: a data URL, or bare base64 (which some clients send)."""
    return data_url_problem(data) if data[:5].lower() == "data:" else base64_problem(data)
