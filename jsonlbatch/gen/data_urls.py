"""Local pictures and files into requests, as `data:` URLs: what gen's templates call with
`{{ path | data_url }}`, `{{ path | image_part | tojson }}` and `{{ path | file_part | tojson }}`,
and what a Python pipeline calls beside `RequestWriter.add`.

No server can read a path on this machine, so the file's bytes travel in the request, base64
encoded. The MIME type comes from the file's first bytes, never its name (a `.png` that is a
JPEG is sent as what it is; a text file named `.jpg` is refused). A file is checked before it
is read: a missing one, a folder, a device or a file over `MAX_FILE_BYTES` is refused by its
`stat`, so a 2 GB file is never read into memory. A picture cut short (a PNG without its IEND
chunk) or whose header gives no size is refused too: the provider would refuse it anyway,
after the batch was uploaded.

`max_side` shrinks a picture whose longer side exceeds it (Pillow, the `images` extra), so a
request stays under a provider's cap and its image tokens under control; a picture already
small enough is sent byte for byte.
"""

from __future__ import annotations

import base64
import io
import os
import stat
from typing import Any

from jsonlbatch.batch_format.media import (
    IMAGE_TYPES,
    KNOWN_TYPES,
    bytes_reader,
    image_size,
    sniff,
    truncated,
)
from jsonlbatch.errors import InputError
from jsonlbatch.extras import load

#: The largest file embedded as it is (the providers' per-request caps are 20-50 MB, and base64
#: adds a third). A larger picture can still go in shrunk: `max_side`, up to `MAX_SOURCE_BYTES`.
MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_SOURCE_BYTES = 200 * 1024 * 1024
_PIL_FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WEBP"}


class MediaError(InputError):
    """A local file that cannot go into a request (gen names the row that asked for it)."""


def read_media(
    path: str | os.PathLike[str], *, base: str | None = None, limit: int = MAX_FILE_BYTES
) -> tuple[bytes, str]:
    """(bytes, MIME type) of a local file; a relative path is read from `base` (a folder)."""
    name = os.fspath(path)
    if not isinstance(name, str) or not name.strip():
        raise MediaError("no file named: the path is empty")
    full = os.path.normpath(os.path.join(base, name)) if base and not os.path.isabs(name) else name
    shown = repr(full) if full == name else f"{name!r} (read as {full!r})"
    try:
        st = os.stat(full)
    except OSError as exc:
        raise MediaError(f"cannot read {shown}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise MediaError(f"{shown} is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise MediaError(f"{shown} is not a regular file")
    if st.st_size > limit:
        raise MediaError(
            f"{shown} is {st.st_size / 2**20:,.1f} MB, over the {limit / 2**20:.0f} MB a file "
            "may take in a request"
            + (
                " (a picture can be shrunk: data_url(max_side=1024))"
                if limit < MAX_SOURCE_BYTES
                else ""
            )
        )
    try:
        with open(full, "rb") as file:
            data = file.read(limit + 1)
    except OSError as exc:
        raise MediaError(f"cannot read {shown}: {exc.strerror}") from None
    if len(data) > limit:
        raise MediaError(f"{shown} grew past {limit / 2**20:.0f} MB while read")
    mime = sniff(data[:16])
    if mime is None:
        raise MediaError(
            f"{shown} is not a {KNOWN_TYPES} file (its first bytes: {data[:8]!r}); the type is "
            "read from the content, not the name"
        )
    if mime in IMAGE_TYPES:
        if image_size(bytes_reader(data)) is None:
            raise MediaError(f"{shown} is a broken {mime[6:].upper()}: its header gives no size")
        if truncated(data, mime):
            raise MediaError(f"{shown} is a truncated {mime[6:].upper()} (its end is missing)")
    return data, mime


def data_url(
    path: str | os.PathLike[str], max_side: int | None = None, *, base: str | None = None
) -> str:
    """`data:<type>;base64,...` of a local file, its type read from its bytes. With `max_side`,
    a picture whose longer side is over it is shrunk to it (Pillow: `pip install
    'jsonlbatch[images]'`)."""
    if max_side is not None:
        if type(max_side) is not int or max_side < 16:
            raise MediaError(
                f"max_side must be a whole number of pixels, at least 16, not {max_side!r}"
            )
        data, mime = read_media(path, base=base, limit=MAX_SOURCE_BYTES)
        if mime in IMAGE_TYPES:
            data, mime = _shrink(data, mime, max_side, path)
        if len(data) > MAX_FILE_BYTES:
            raise MediaError(f"{os.fspath(path)!r} is over {MAX_FILE_BYTES >> 20} MB even shrunk")
    else:
        data, mime = read_media(path, base=base)
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_part(
    path: str | os.PathLike[str],
    max_side: int | None = None,
    detail: str | None = None,
    *,
    base: str | None = None,
) -> dict[str, Any]:
    """An OpenAI chat `image_url` part holding a local picture (`detail`: low, high or auto)."""
    if detail not in (None, "low", "high", "auto"):
        raise MediaError(f"detail must be low, high or auto, not {detail!r}")
    url = data_url(path, max_side, base=base)
    if not url.startswith("data:image/"):
        raise MediaError(f"{os.fspath(path)!r} is not a picture (a PDF): use file_part")
    image: dict[str, Any] = {"url": url}
    if detail is not None:
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def file_part(
    path: str | os.PathLike[str], filename: str | None = None, *, base: str | None = None
) -> dict[str, Any]:
    """An OpenAI chat `file` part holding a local file (a PDF): its name and its data URL."""
    name = filename if filename is not None else os.path.basename(os.fspath(path))
    return {"type": "file", "file": {"filename": name, "file_data": data_url(path, base=base)}}


def _shrink(data: bytes, mime: str, max_side: int, path: Any) -> tuple[bytes, str]:
    size = image_size(bytes_reader(data))
    if size is not None and max(size) <= max_side:
        return data, mime  # small enough: sent byte for byte
    image_module = load("PIL.Image", extra="images", for_what="data_url(max_side=...)")
    ops = load("PIL.ImageOps", extra="images", for_what="data_url(max_side=...)")
    try:
        with image_module.open(io.BytesIO(data)) as opened:
            opened.draft("RGB", (max_side, max_side))  # JPEG: decode at a reduced scale
            # a phone's portrait photo is stored sideways with an EXIF note to turn it; the
            # copy keeps no EXIF, so it is turned here or the model would see it sideways
            picture = ops.exif_transpose(opened) or opened
            picture.thumbnail((max_side, max_side))
            fmt = _PIL_FORMATS[mime]
            if fmt == "JPEG" and picture.mode not in ("RGB", "L"):
                picture = picture.convert("RGB")
            out = io.BytesIO()
            picture.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    except (OSError, ValueError, SyntaxError, image_module.DecompressionBombError) as exc:
        raise MediaError(f"cannot shrink {os.fspath(path)!r}: {exc}") from None
    return out.getvalue(), mime
