"""GDAL's own words for a failed read.

rasterio raises "Read failed. See previous exception for details." and chains the errors GDAL
signalled; the last of them is the cause a user can act on ("ZIPDecode:Decoding error at
scanline 0", "vrt/member.tif: No such file or directory"), and it is only logged, at INFO, by
rasterio. Every reader that turns a failed read into a one-line error takes its reason here.
"""

from __future__ import annotations

__all__ = ["gdal_reason", "open_failed"]


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and its causes (explicit, else implicit), outermost first, each once."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and all(cause is not seen for seen in chain):
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def open_failed(exc: BaseException) -> bool:
    """Whether GDAL failed to open a file while reading (a VRT's member that is missing or
    unreadable), rather than failing to decode the pixels of the file itself."""
    from rasterio._err import CPLE_OpenFailedError  # rasterio: only on this error path

    return any(isinstance(e, CPLE_OpenFailedError) for e in _chain(exc))


def gdal_reason(exc: BaseException) -> str:
    """The innermost non-empty message of `exc`'s chain of causes, on one line (the type's
    name when none says anything)."""
    texts = [" ".join(str(e).split()) for e in _chain(exc)]
    return next((t for t in reversed(texts) if t), type(exc).__name__)
