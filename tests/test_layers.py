"""The import graph of the three packages: one-way layers and no circles.

`landcover` may import `tiling` and `cluster`; neither of them imports `landcover`, directly
or through another module. No module reaches itself through its imports, counting the imports
made only for type checking (a circle there is still two modules that cannot be read apart).
The graph is grimp's (import-linter's engine), built from the sources without importing them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import grimp
import pytest

PACKAGES = ("tiling", "landcover", "cluster")
LOWER_LAYERS = ("tiling", "cluster")


def import_circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm, iterative)."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            module, i = work.pop()
            if i == 0:
                index[module] = low[module] = len(index)
                stack.append(module)
                on_stack.add(module)
            targets = [t for t in imports[module] if t in imports]
            if i < len(targets):
                work.append((module, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            if work:  # returning to the caller: it inherits this module's low link
                caller = work[-1][0]
                low[caller] = min(low[caller], low[module])
            if low[module] == index[module]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == module:
                        break
                if len(members) > 1:
                    circles.append(sorted(members))
    return circles


def describe(graph: grimp.ImportGraph, circle: Iterable[str]) -> str:
    members = set(circle)
    lines = []
    for importer in sorted(members):
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
            for detail in graph.get_import_details(importer=importer, imported=imported):
                lines.append(f"{importer}:{detail['line_number']} -> {imported}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_no_module_imports_itself_through_others(graph: grimp.ImportGraph) -> None:
    circles = import_circles(graph)
    assert not circles, "\n\n".join(describe(graph, c) for c in circles)


@pytest.mark.parametrize("lower", LOWER_LAYERS)
def test_lower_layers_never_import_landcover(graph: grimp.ImportGraph, lower: str) -> None:
    chains = graph.find_shortest_chains(importer=lower, imported="landcover", as_packages=True)
    assert not chains, [" -> ".join(chain) for chain in chains]


def test_a_circle_and_an_upward_import_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks above on a package made to break both rules."""
    root = tmp_path / "layered"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from layered import b\n")
    (root / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from layered import a\n")  # fmt: skip
    (root / "low.py").write_text("def f():\n    from layered import top\n")
    (root / "top.py").write_text("")
    (root / "ok.py").write_text("from layered import low\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    made = grimp.build_graph("layered", cache_dir=None)
    assert import_circles(made) == [["layered.a", "layered.b"]]
    assert made.find_shortest_chains(importer="layered.low", imported="layered.top")


RUNTIME = "tiling.runtime"


def _tiling_imports(graph: grimp.ImportGraph, package: str) -> set[tuple[str, str]]:
    """(importer, imported) for each module of tiling that a module of `package` imports."""
    modules = {package} | graph.find_descendants(package)
    return {
        (m, t)
        for m in modules
        for t in graph.find_modules_directly_imported_by(m)
        if t.split(".")[0] == "tiling"
    }


def _in_runtime(module: str) -> bool:
    return module == RUNTIME or module.startswith(f"{RUNTIME}.")


def test_cluster_uses_only_the_runtime_layer_of_tiling(graph: grimp.ImportGraph) -> None:
    """cluster may import `tiling.runtime` (the layer all three packages use), nothing else of
    tiling; and the runtime layer imports nothing of tiling but itself and `tiling.errors`, so
    cluster reaches no more of tiling through it."""
    beyond = {pair for pair in _tiling_imports(graph, "cluster") if not _in_runtime(pair[1])}
    assert not beyond, sorted(beyond)
    outside = {
        (m, t)
        for m, t in _tiling_imports(graph, RUNTIME)
        if not _in_runtime(t) and t not in ("tiling", "tiling.errors")
    }
    assert not outside, sorted(outside)


def test_the_runtime_layer_is_cheap_to_import() -> None:
    """No torch, zarr, fsspec or rasterio when every runtime module is imported."""
    import subprocess
    import sys

    runtime = sorted(
        p.stem for p in (Path(__file__).parents[1] / "tiling" / "runtime").glob("*.py")
    )
    code = (
        "import sys\n"
        + "".join(f"import tiling.runtime.{name}\n" for name in runtime if name != "__init__")
        + "print(sorted({'torch', 'zarr', 'fsspec', 'rasterio'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def engine_packages() -> list[str]:
    """The sub-packages of `cluster` that hold an engine, as the registry names them."""
    from cluster.engines import ENGINES

    return sorted({info.target.split(":")[0].rsplit(".", 1)[0] for info in ENGINES.values()})


def imports_into(graph: grimp.ImportGraph, importer: str, imported: str) -> list[str]:
    """Every chain by which a module of package `importer` reaches a module of package
    `imported` (function-level and type-checking imports included), as text."""
    chains = graph.find_shortest_chains(importer=importer, imported=imported, as_packages=True)
    return sorted(" -> ".join(chain) for chain in chains)


def test_engines_are_sub_packages_the_registry_names() -> None:
    """The check below covers every engine: each registry row lives in its own package."""
    packages = engine_packages()
    assert packages and all(p.startswith("cluster.") and p.count(".") == 1 for p in packages)
    assert "cluster.dask" in packages


@pytest.mark.parametrize("engine", engine_packages())
def test_landcover_imports_no_engine(graph: grimp.ImportGraph, engine: str) -> None:
    """`landcover` reaches an engine only through the registry (`cluster.engines`,
    `cluster.tasks`), which imports it by name at run time: no import of an engine's module,
    direct or through another module, so a new engine is a sub-package plus a row."""
    assert not imports_into(graph, "landcover", engine)


def test_an_import_of_an_engine_module_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above on a package whose top layer imports an engine's module, once directly
    and once through a helper, inside a function as `landcover.oncluster` did."""
    root = tmp_path / "engined"
    for folder in (root, root / "top", root / "eng"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (root / "eng" / "client.py").write_text("")
    (root / "registry.py").write_text("import importlib\n")
    (root / "top" / "direct.py").write_text("def f():\n    from engined.eng.client import x\n")
    (root / "top" / "clean.py").write_text("from engined import registry\n")
    (root / "helper.py").write_text("from engined.eng import client\n")
    (root / "top" / "indirect.py").write_text("from engined import helper\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    made = grimp.build_graph("engined", cache_dir=None)
    assert imports_into(made, "engined.top", "engined.eng") == [
        "engined.top.direct -> engined.eng.client",
        "engined.top.indirect -> engined.helper -> engined.eng.client",
    ]
    assert not imports_into(made, "engined.top.clean", "engined.eng")


# The sub-packages of tiling, floor by floor from the bottom. A module imports modules of its
# own sub-package and of lower floors only: no import sideways between two sub-packages of one
# floor, none back up. A module of tiling outside every entry has no floor and fails the test.
TILING_ROOT = ("tiling", "tiling.errors")  # the package's own modules: floor 0
TILING_FLOORS: tuple[tuple[str, ...], ...] = (
    TILING_ROOT,
    ("tiling.runtime",),
    ("tiling.staged", "tiling.sources"),
    ("tiling.chipstore", "tiling.synthetic"),
    ("tiling.tiler",),
)


def floor_units(
    floors: tuple[tuple[str, ...], ...], root: tuple[str, ...]
) -> Callable[[str], tuple[int, str] | None]:
    """`module -> (floor, unit)`: the root modules are one unit, a sub-package's module belongs
    to its sub-package; None for a module on no floor."""

    def place(module: str) -> tuple[int, str] | None:
        for floor, units in enumerate(floors):
            for unit in units:
                if module == unit or (unit not in root and module.startswith(f"{unit}.")):
                    return floor, (root[0] if unit in root else unit)
        return None

    return place


def floor_violations(
    graph: grimp.ImportGraph,
    package: str,
    floors: tuple[tuple[str, ...], ...],
    root: tuple[str, ...],
) -> list[str]:
    """Each module of `package` on no floor, and each import from one unit into another that
    is not on a lower floor, as text."""
    place = floor_units(floors, root)
    found = []
    modules = sorted({package} | graph.find_descendants(package))
    for module in modules:
        here = place(module)
        if here is None:
            found.append(f"{module}: on no floor")
            continue
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            there = place(imported) if imported.split(".")[0] == package else None
            if there is None or there[1] == here[1] or there[0] < here[0]:
                continue
            way = "sideways" if there[0] == here[0] else "up"
            found.append(f"{module} -> {imported} ({way}: floor {here[0]} -> {there[0]})")
    return found


def test_tiling_imports_point_down_its_floors(graph: grimp.ImportGraph) -> None:
    assert not floor_violations(graph, "tiling", TILING_FLOORS, TILING_ROOT)


def test_an_import_sideways_or_up_a_floor_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above on a package with one import up a floor, one sideways and a module on
    no floor."""
    root = tmp_path / "floored"
    for folder in (root, root / "low", root / "left", root / "right", root / "top"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (root / "errors.py").write_text("")
    (root / "low" / "base.py").write_text("from floored import errors\n")
    (root / "left" / "a.py").write_text("from floored.low import base\n")
    (root / "right" / "b.py").write_text("def f():\n    from floored.left import a\n")
    (root / "top" / "run.py").write_text(
        "from floored.left import a\nfrom floored.right import b\n"
    )
    (root / "low" / "up.py").write_text("from floored.top import run\n")
    (root / "stray.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    made = grimp.build_graph("floored", cache_dir=None)
    floors = (("floored", "floored.errors"), ("floored.low",), ("floored.left", "floored.right"),
              ("floored.top",))  # fmt: skip
    assert floor_violations(made, "floored", floors, ("floored", "floored.errors")) == [
        "floored.low.up -> floored.top.run (up: floor 1 -> 3)",
        "floored.right.b -> floored.left.a (sideways: floor 2 -> 2)",
        "floored.stray: on no floor",
    ]
