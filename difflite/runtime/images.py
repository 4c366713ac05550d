"""The one way difflite reads a picture a user gives it (`generate --init-image`, and every image
option after it): bounds on the file size, the declared pixels and a PNG's ancillary chunks are
checked before any pixel is decoded, and every failure is one BadInput line naming the option and
the file.

The bounds hold the memory of a hostile file to about what the largest legal picture costs
(MAX_PIXELS at 4 bytes a pixel, PIL's RGB layout, plus the file): a tiny PNG declaring a huge
canvas is refused from its header, a compressed text chunk never expands past PIL's
PngImagePlugin.MAX_TEXT_CHUNK (1 MiB, its default, left as it is for the whole process), and at
most MAX_TEXT_CHUNKS of them are read."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

from difflite.core.errors import BadInput

MAX_FILE_BYTES = 64 * 2**20
MAX_PIXELS = 64_000_000  # an 8K (7680 x 4320, 33 Mpx) photo and a 50 Mpx camera's pass
FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")  # JPEG opens phones' MPO files too
# PNG ancillary chunks (ICC profiles, EXIF, XMP text: a few hundred KiB in real files)
MAX_ANCILLARY_BYTES = 8 * 2**20
MAX_TEXT_CHUNKS = 32
TEXT_CHUNKS = (b"tEXt", b"zTXt", b"iTXt")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_image(path, *, option: str = "--init-image", mode: str | None = "RGB"):
    """The picture at `path` as a PIL image, decoded only after its bounds are checked, in `mode`
    (None: as decoded, at most 4 bytes a pixel like RGB; the mask is resized in its own mode
    before it is made grayscale, as diffusers does)."""
    from PIL import Image

    path = Path(path)
    where = f"{option} {path}"
    _check_file(path, where)
    _check_png_chunks(path, where)
    try:
        with warnings.catch_warnings():
            # PIL's own bomb guard warns (to stderr) between its limit and twice it: an error here;
            # its other warnings (a plugin it lacks) would be lines besides the one error line
            warnings.simplefilter("ignore")
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=FORMATS) as opened:
                _check_pixels(opened.size, where)
                opened.load()
                return opened if mode is None or opened.mode == mode else opened.convert(mode)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadInput(f"{where}: declares more than the {MAX_PIXELS // 10**6} Mpx difflite reads ({exc})") from exc
    except (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error) as exc:
        raise BadInput(f"{where}: not a readable {', '.join(FORMATS[:-1])} or {FORMATS[-1]} image "
                       f"({_reason(exc)})") from exc


def _check_file(path: Path, where: str) -> None:
    if not path.exists():
        raise BadInput(f"{where}: no such image file")
    if not path.is_file():
        raise BadInput(f"{where}: not a file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BadInput(f"{where}: {size / 2**20:.1f} MiB, more than the {MAX_FILE_BYTES // 2**20} MiB an image "
                       f"may take")


def _check_pixels(size: tuple[int, int], where: str) -> None:
    width, height = size
    if width * height > MAX_PIXELS:
        raise BadInput(f"{where}: declares {width} x {height} pixels ({width * height / 1e6:.0f} Mpx), more than "
                       f"the {MAX_PIXELS // 10**6} Mpx difflite reads")


def _check_png_chunks(path: Path, where: str) -> None:
    """Walk a PNG's chunk headers (not their data) before PIL does: the declared size, each
    chunk's length against the file, and the ancillary chunks' count and bytes."""
    try:
        with open(path, "rb") as f:
            if f.read(len(PNG_SIGNATURE)) != PNG_SIGNATURE:
                return
            end = path.stat().st_size
            ancillary_bytes, text_chunks = 0, 0
            while True:
                header = f.read(8)
                if len(header) < 8:
                    return  # truncated: PIL says so when it decodes
                length, kind = struct.unpack(">I4s", header)
                if f.tell() + length + 4 > end:
                    raise BadInput(f"{where}: PNG chunk {_name(kind)} claims {length} bytes, past the end of the "
                                   f"file")
                if kind == b"IHDR" and length >= 8:
                    _check_pixels(struct.unpack(">II", f.read(8)), where)
                    f.seek(-8, 1)
                if kind == b"IEND":
                    return
                if kind[:1].islower():
                    ancillary_bytes += length
                    text_chunks += kind in TEXT_CHUNKS
                    _check_ancillary(ancillary_bytes, text_chunks, where)
                f.seek(length + 4, 1)  # the data and the CRC
    except OSError as exc:
        raise BadInput(f"{where}: cannot read ({exc.strerror or exc})") from exc


def _check_ancillary(total_bytes: int, text_chunks: int, where: str) -> None:
    if total_bytes > MAX_ANCILLARY_BYTES:
        raise BadInput(f"{where}: more than {MAX_ANCILLARY_BYTES // 2**20} MiB of ancillary PNG chunks "
                       f"(metadata, not pixels)")
    if text_chunks > MAX_TEXT_CHUNKS:
        raise BadInput(f"{where}: more than {MAX_TEXT_CHUNKS} PNG text chunks")


def _name(kind: bytes) -> str:
    return kind.decode("latin-1") if kind.isalpha() else repr(kind)


def _reason(exc: BaseException) -> str:
    from PIL import PngImagePlugin

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "MAX_TEXT_CHUNK" in text:  # PIL's own words name its variable, not what happened
        return f"a compressed PNG chunk expands past {PngImagePlugin.MAX_TEXT_CHUNK // 2**20} MiB"
    return text[:200]
