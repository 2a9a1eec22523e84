"""Reading a request body: decoded (gzip, deflate), bounded in size, its bytes held under the request's lease."""

from __future__ import annotations

from aiohttp import web

from gateway.edge.body.budget import BodyLease
from gateway.edge.body.encoding import BodyDecoder, coding_of
from gateway.errors import PayloadTooLarge


async def read_body(request: web.Request, lease: BodyLease, *, max_bytes: int) -> bytes:
    """The whole body, decoded (gzip, deflate), at most ``server.max_body_bytes``; the bytes are held under the
    request's lease (``server.max_held_body_bytes`` across requests), as they arrive, until the request is over."""
    limit = max_bytes
    coding = coding_of(request.headers.get("Content-Encoding"))
    declared = request.content_length
    if declared is not None and declared > limit:
        raise PayloadTooLarge(f"request body is {declared:,} bytes; the limit (server.max_body_bytes) is {limit:,}")
    if coding is None and request.content.is_eof():  # the whole body came with the headers: no reads to await
        body = request.content.read_nowait()
        if len(body) > limit:
            raise PayloadTooLarge(f"request body is over {limit:,} bytes, the limit (server.max_body_bytes); send less")
        if len(body) > lease.held_bytes:
            await lease.take(len(body) - lease.held_bytes)
        return body
    decoder = BodyDecoder(coding, max_bytes=limit) if coding is not None else None
    # bytes are held as they arrive, not as declared: a client that declares 32 MiB and sends one byte holds one
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        pieces = decoder.feed(chunk) if decoder is not None else [chunk]
        for piece in pieces:
            size += len(piece)
            if size > limit:
                raise PayloadTooLarge(
                    f"request body is over {limit:,} bytes, the limit (server.max_body_bytes); send less"
                )
            if size > lease.held_bytes:
                await lease.take(size - lease.held_bytes)
            chunks.append(piece)
    if decoder is not None:
        for piece in decoder.finish():
            size += len(piece)
            await lease.take(max(0, size - lease.held_bytes))
            chunks.append(piece)
    return b"".join(chunks)
