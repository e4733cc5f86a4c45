"""Lazy public names for subpackages that import torch, rasterio or matplotlib.

`landcover.training.config` must load without torch (the CLI builds and checks a configuration
before any worker starts), so a subpackage's `__init__` cannot import all of its modules.
`lazy_exports` gives it a module `__getattr__` that imports a public name's module on first use
(PEP 562); the `__init__` also imports the names under `TYPE_CHECKING`, so type checkers and
readers see them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`, whose public name N lives in module
    `package.exports[N]`."""

    def __getattr__(name: str) -> Any:  # noqa: N807 (PEP 562 names)
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(exports)

    return __getattr__, __dir__
