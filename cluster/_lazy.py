"""An engine sub-package's public names, each imported from its module on first use, so that
importing one module of an engine (its section, its rank runner) imports nothing else of it
and `import cluster.<engine>` stays cheap."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, modules: Mapping[str, tuple[str, ...]]) -> Callable[[str], object]:
    """The module `__getattr__` of `package` (PEP 562): each name of `modules` (module → its
    public names) comes from `package.module` when first asked for."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> object:  # noqa: N807 (the name PEP 562 looks up)
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
