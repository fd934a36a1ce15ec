"""Zip archives for the bundle tests, built byte by byte where a tool would refuse to make them."""

from __future__ import annotations

import io
import stat
import struct
import zipfile

ROLLOUT = (
    "import json\n"
    "from pathlib import Path\n\n"
    "import art\n"
    "from utils import greeting\n\n\n"
    "async def rollout(model, scenario):\n"
    "    words = json.loads((Path(__file__).parent / 'data' / 'words.json').read_text())\n"
    "    text = greeting(words[scenario['i']])\n"
    "    return art.Trajectory(messages_and_choices=[{'role': 'user', 'content': text}], reward=1.0,\n"
    "                          metadata={'text': text})\n"
)
UTILS = "def greeting(word):\n    return 'hello ' + word\n"


def make_zip(entries: list[tuple[str, bytes] | zipfile.ZipInfo | tuple[zipfile.ZipInfo, bytes]]) -> bytes:
    """A zip of (name, bytes) or (ZipInfo, bytes) entries, in this order, names exactly as given."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = name if isinstance(name, zipfile.ZipInfo) else zipfile.ZipInfo(name)
            if not isinstance(name, zipfile.ZipInfo):
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return out.getvalue()


def good_files() -> list[tuple[str, bytes]]:
    return [("rollout.py", ROLLOUT.encode()), ("utils.py", UTILS.encode()), ("data/words.json", b'["world", "there"]')]


def symlink_entry(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target.encode()


def wheel(module: str, source: str) -> bytes:
    """A minimal pure-Python wheel: one module and its dist-info."""
    return make_zip(
        [
            (f"{module}.py", source.encode()),
            (f"{module}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n".encode()),
            (f"{module}-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        ]
    )


def lying_sizes(data: bytes, name: str, declared: int) -> bytes:
    """`data` (a zip holding `name`) with that entry's uncompressed size rewritten to `declared` in both its
    local header and the central directory, as a zip bomb that lies about its size would."""
    raw = bytearray(data)
    encoded = name.encode()
    for signature, size_at, name_at in ((b"PK\x03\x04", 22, 30), (b"PK\x01\x02", 24, 46)):
        at = raw.find(signature)
        while at != -1:
            if raw[at + name_at : at + name_at + len(encoded)] == encoded:
                struct.pack_into("<I", raw, at + size_at, declared)
            at = raw.find(signature, at + 4)
    return bytes(raw)
