"""GDAL's own words for a failed read.

rasterio raises "Read failed. See previous exception for details." and chains the errors GDAL
signalled; the last of them is the cause a user can act on ("ZIPDecode:Decoding error at
scanline 0", "vrt/member.tif: No such file or directory"), and it is only logged, at INFO, by
rasterio. Every reader that turns a failed read into a one-line error takes its reason here.
"""

from __future__ import annotations

__all__ = ["gdal_reason"]


def gdal_reason(exc: BaseException) -> str:
    """The innermost non-empty message of `exc`'s chain of causes, on one line (the type's
    name when none says anything)."""
    reason = ""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        text = " ".join(str(cause).split())
        if text:
            reason = text
        cause = cause.__cause__ or cause.__context__
    return reason or type(exc).__name__
