"""Small valid pictures for the media tests, made with Pillow (no downloads)."""

from __future__ import annotations

import base64
import io
import random

from PIL import Image


def picture(seed: int, size: int = 16, fmt: str = "PNG") -> bytes:
    """A `size` x `size` image of noise, different for each seed (so it compresses little)."""
    noise = random.Random(seed).randbytes(size * size * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (size, size), noise).save(out, fmt)
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"
