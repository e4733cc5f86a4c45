"""The `landcover` command: a lazy group (`app`), shared options, one error mapping, and a
module per command group (tiling, train, cluster, report, predict, demo)."""

from landcover.cli.app import USER_ERRORS, UserFacingError, main

__all__ = ["USER_ERRORS", "UserFacingError", "main"]
