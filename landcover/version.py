"""The installed package's version, read from its metadata: pyproject.toml sets it once."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("landcover")
except PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
