"""Exported weights that hash the same every time: safetensors with a sorted header."""

from __future__ import annotations

import json


def sorted_header(data: bytes) -> bytes:
    """A safetensors file with its JSON header's keys sorted: the library writes its metadata map in an order
    that changes from process to process, so the same weights would not give the same bytes twice."""
    size = int.from_bytes(data[:8], "little")
    text = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True, separators=(",", ":")).encode()
    if len(text) > size:  # not the compact JSON the library writes: leave the file as it is
        return data
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]
