"""Request bodies with a ``Content-Encoding``: decoded, bounded, or refused.

kvgate's server leaves request bodies as sent (``auto_decompress=False``). A body kvgate reads (chat, generate,
embeddings, ...) is decoded here and forwarded decoded, without its ``Content-Encoding``; a body kvgate streams
through (uploads, model management) keeps both its bytes and its header, so the backend decodes it.

    Content-Encoding    on a body kvgate reads
    (none), identity    as is
    gzip, x-gzip        decoded (gzip members, one after another)
    deflate             decoded (zlib-wrapped, or raw deflate as some clients send it)
    anything else       415, naming what is decoded (several codings at once included)
    broken data         400, naming the coding and what is wrong

Decoding is incremental with a cap on its output: a body that decodes to more than ``max_body_bytes`` is refused
(413) as soon as it passes the cap, so a zip bomb costs kvgate at most the cap, never its expansion.
"""

from __future__ import annotations

import zlib

from gateway.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType

GZIP = "gzip"
DEFLATE = "deflate"
_NAMES = {"gzip": GZIP, "x-gzip": GZIP, "deflate": DEFLATE}
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_OUT_STEP_BYTES = 256 * 1024


def coding_of(content_encoding: str | None) -> str | None:
    """The one coding kvgate decodes for this header value, None for none; raises UnsupportedMediaType."""
    if content_encoding is None:
        return None
    codings = [c.strip().lower() for c in content_encoding.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _NAMES:
        return _NAMES[codings[0]]
    shown = content_encoding.encode("ascii", "backslashreplace").decode("ascii")[:64]
    raise UnsupportedMediaType(
        f"request body has Content-Encoding {shown!r}; kvgate decodes gzip or deflate (one of them) or none: "
        "send it uncompressed or gzip-compressed"
    )


class BodyDecoder:
    """Decodes one body chunk by chunk; ``feed`` returns the decoded bytes, never more than ``max_bytes`` in all."""

    def __init__(self, coding: str, *, max_bytes: int) -> None:
        self.coding = coding
        self.max_bytes = max_bytes
        self.decoded_bytes = 0
        self._first = True
        self._zlib = self._new()

    def _new(self, *, raw: bool = False) -> zlib._Decompress:
        if self.coding == GZIP:
            return zlib.decompressobj(_GZIP_WBITS)
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> list[bytes]:
        """The decoded bytes of ``chunk``, in pieces; raises BadRequest or PayloadTooLarge."""
        if self._first and chunk:
            self._first = False
            if self.coding == DEFLATE and chunk[0] & 0x0F != 8:
                self._zlib = self._new(raw=True)  # raw deflate, without the zlib header
        out: list[bytes] = []
        data = chunk
        while data:
            if self._zlib.eof:
                if self.coding != GZIP:
                    raise self._broken("data after the end of the compressed stream")
                self._zlib = self._new()  # the next gzip member
            room = self.max_bytes - self.decoded_bytes + 1
            left = len(data)
            try:
                piece = self._zlib.decompress(data, min(room, _OUT_STEP_BYTES))
            except zlib.error as exc:
                raise self._broken(str(exc)) from None
            self._count(piece)
            if piece:
                out.append(piece)
            data = self._zlib.unused_data if self._zlib.eof else self._zlib.unconsumed_tail
            if not piece and not self._zlib.eof and len(data) >= left:
                raise self._broken("the decoder made no progress")
        return out

    def finish(self) -> list[bytes]:
        """What is left once the body has ended; raises BadRequest if the stream stopped short."""
        try:
            piece = self._zlib.flush()
        except zlib.error as exc:
            raise self._broken(str(exc)) from None
        self._count(piece)
        if not self._zlib.eof and not self._first:
            raise self._broken("the compressed stream ends early (truncated)")
        return [piece] if piece else []

    def _count(self, piece: bytes) -> None:
        self.decoded_bytes += len(piece)
        if self.decoded_bytes > self.max_bytes:
            raise PayloadTooLarge(
                f"request body decodes ({self.coding}) to over {self.max_bytes:,} bytes, the limit "
                "(server.max_body_bytes); send less"
            )

    def _broken(self, what: str) -> BadRequest:
        return BadRequest(f"request body is labelled Content-Encoding: {self.coding} but is not valid {self.coding} "
                          f"data: {what}; send it uncompressed or compress it correctly")
