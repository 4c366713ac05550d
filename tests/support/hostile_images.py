"""Hostile and legal image files, written by hand (no encoder decodes them to check): PNGs built
chunk by chunk with correct CRCs, so that only the bounds difflite sets can refuse them."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RGB8 = (8, 2)  # bit depth, colour type


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def ihdr(width: int, height: int) -> bytes:
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, *RGB8, 0, 0, 0))


def png(width: int, height: int, *extra: bytes, pixels: bytes | None = None) -> bytes:
    """A PNG of `width` x `height` RGB pixels, `extra` chunks between the header and the data;
    the data is `pixels` (raw rows, each led by its filter byte) or one row of black."""
    rows = pixels if pixels is not None else bytes(1 + 3 * min(width, 1 << 16))
    return PNG_SIGNATURE + ihdr(width, height) + b"".join(extra) + chunk(b"IDAT", zlib.compress(rows)) + \
        chunk(b"IEND", b"")


def decompression_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A few hundred bytes declaring width x height pixels (30 GB decoded)."""
    return png(width, height)


def deflated_zeros(count: int) -> bytes:
    """`count` zero bytes, zlib-compressed a MiB at a time (about 0.1% of `count`)."""
    compressor = zlib.compressobj(9)
    block = bytes(1 << 20)
    return b"".join(compressor.compress(block) for _ in range(count // len(block))) + compressor.flush()


def ztxt_bomb(expanded_bytes: int = 300 * 2**20) -> bytes:
    """A 1x1 PNG with a zTXt chunk whose text inflates to `expanded_bytes`."""
    return png(1, 1, chunk(b"zTXt", b"Comment\x00\x00" + deflated_zeros(expanded_bytes)))


def itxt_bomb(expanded_bytes: int = 300 * 2**20) -> bytes:
    """The same with a compressed iTXt chunk (keyword, compression flag 1, method 0, no language
    or translated keyword)."""
    return png(1, 1, chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x01\x00\x00\x00" + deflated_zeros(expanded_bytes)))


def many_text_chunks(count: int) -> bytes:
    return png(1, 1, *(chunk(b"tEXt", b"k\x00" + str(i).encode()) for i in range(count)))


def oversized(path: Path, size: int) -> Path:
    """A file of `size` bytes that starts as a PNG (sparse: nothing but the header is written)."""
    with open(path, "wb") as f:
        f.write(png(1, 1))
        f.truncate(size)
    return path


def garbage() -> bytes:
    return b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def truncated(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


def bmp_header(width: int, height: int) -> bytes:
    """A 24-bit BMP's headers declaring width x height pixels, and no pixels."""
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


def jpeg(width: int, height: int) -> bytes:
    """A real JPEG of a gradient (PIL's encoder)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.linear_gradient("L").resize((width, height)).convert("RGB").save(buffer, format="JPEG")
    return buffer.getvalue()
