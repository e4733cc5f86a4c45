"""The notebooks in notebooks/: committed as .ipynb without outputs (edited as notebooks,
linted by ruff with the code), and executed end to end on tiny sizes
(LANDCOVER_NOTEBOOK_SMALL=1) so that they never rot."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.conftest import REPO_ROOT
from tiling.chipstore.store import FORMAT_VERSION

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = (
    "01_tile_naip.ipynb",
    "02_train_and_scale.ipynb",
    "03_predict_region.ipynb",
    "04_dask.ipynb",
    "05_area_and_change.ipynb",
)
KERNEL = "python3"
CELL_TIMEOUT_S = 300
# Cells that must draw a figure: an inline backend that stopped rendering would fail here.
FIGURE_CELLS = {
    "01_tile_naip.ipynb": {"mosaic", "zoom", "balance", "chips", "split", "real-show"},
    "02_train_and_scale.ipynb": {"curves", "report-figures"},
    "03_predict_region.ipynb": {"compare", "confidence", "confusion"},
    "05_area_and_change.ipynb": {"estimate-plot", "change-plot"},
}


def read(name: str) -> Any:
    return nbformat.read(NOTEBOOK_DIR / name, as_version=4)  # type: ignore[no-untyped-call]


def execute(name: str, *, cwd: Path) -> Any:
    """Run every cell in a fresh python3 kernel started in `cwd`; the first failing cell
    raises CellExecutionError with its traceback."""
    notebook = read(name)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute()
    return notebook


def cell(notebook: Any, cell_id: str) -> Any:
    return next(c for c in notebook.cells if c.get("id") == cell_id)


def stdout(notebook: Any, cell_id: str) -> str:
    outputs = cell(notebook, cell_id).outputs
    return "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")


def assert_figures(notebook: Any, name: str) -> None:
    drawn = {
        c.id
        for c in notebook.cells
        if c.cell_type == "code" and any("image/png" in o.get("data", {}) for o in c.outputs)
    }
    missing = FIGURE_CELLS[name] - drawn
    assert not missing, f"{name}: cells {sorted(missing)} drew no figure"


@pytest.fixture()
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The notebooks' WORK directory; the kernel inherits this environment."""
    for key in [k for k in os.environ if k.startswith("LANDCOVER_NOTEBOOK_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LANDCOVER_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("LANDCOVER_NOTEBOOK_WORK", str(tmp_path / "work"))
    return tmp_path / "work"


# -- what is committed ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_has_no_outputs(name: str) -> None:
    notebook = read(name)
    nbformat.validate(notebook)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    for c in code_cells:
        assert c.outputs == [], (
            f"{name} cell {c.id}: outputs committed; clear them before committing"
        )
        assert c.execution_count is None, f"{name} cell {c.id}: execution count committed"
    assert code_cells[0].metadata.get("tags") == ["parameters"]
    assert notebook.metadata.kernelspec.name == KERNEL


def test_python3_kernel_runs_this_interpreter() -> None:
    # jupyter_client starts the "python3" spec's `python` as sys.executable: the kernel sees
    # this venv's packages (landcover included), whatever `python` is on PATH.
    command = KernelManager(kernel_name=KERNEL).format_kernel_cmd()
    assert command[0] == sys.executable


# -- executed ------------------------------------------------------------------------------------


@pytest.mark.slow  # ~10 s: kernel start, synth, tile, figures
def test_tile_naip_notebook_runs(work: Path) -> None:
    notebook = execute("01_tile_naip.ipynb", cwd=NOTEBOOK_DIR)

    assert_figures(notebook, "01_tile_naip.ipynb")
    assert f"(format version {FORMAT_VERSION}, complete)" in stdout(notebook, "info")
    real = stdout(notebook, "real-find")
    assert "['red', 'green', 'blue', 'alpha']" in real
    assert "is the NIR band itself: True" in real
    assert "validity as the tiler reads it: 'zero'" in real
    assert "in all four bands: True" in stdout(notebook, "real-tile")
    assert (work / "01-tile-naip" / "chips.zarr").is_dir()


@pytest.mark.slow  # ~60 s: two torchrun launches (1 and 2 workers), report, predict, evaluate
def test_train_notebook_then_predict_notebook_share_work(work: Path) -> None:
    trained = execute("02_train_and_scale.ipynb", cwd=NOTEBOOK_DIR)

    assert_figures(trained, "02_train_and_scale.ipynb")
    table = stdout(trained, "sweep").splitlines()
    assert [line.split()[0] for line in table[1:]] == ["1", "2"]
    assert (work / "report" / "report.html").is_file()
    assert (work / "pipeline.json").is_file()

    predicted = execute("03_predict_region.ipynb", cwd=NOTEBOOK_DIR)

    assert_figures(predicted, "03_predict_region.ipynb")
    assert "reusing notebook 2's model and scenes" in stdout(predicted, "model")
    assert "from 2 scenes" in stdout(predicted, "predict")
    assert (work / "landcover.tif").is_file()
    assert (work / "evaluation" / "held-out-scene" / "metrics.json").is_file()
    assert not (work / "03-own").exists()


@pytest.mark.slow  # synth, tile and train (one epoch) in the kernel, then predict and evaluate
def test_predict_notebook_runs_alone_from_the_repo_root(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without notebook 2's work the notebook trains its own model: one epoch is enough to
    map, and the notebook reads each size from the environment."""
    monkeypatch.setenv("LANDCOVER_NOTEBOOK_EPOCHS", "1")
    notebook = execute("03_predict_region.ipynb", cwd=REPO_ROOT)

    assert_figures(notebook, "03_predict_region.ipynb")
    assert "no finished notebook 2 here" in stdout(notebook, "model")
    assert (work / "03-own" / "run" / "model.pt").is_file()
    assert (work / "evaluation" / "metrics.json").is_file()


@pytest.mark.slow  # a LocalCluster of 2 workers: tile, train one epoch, predict
def test_dask_notebook_runs_every_stage_on_the_cluster(work: Path) -> None:
    notebook = execute("04_dask.ipynb", cwd=NOTEBOOK_DIR)

    assert "same bytes as one process: True" in stdout(notebook, "tile")
    assert "1 epoch(s), world size 2" in stdout(notebook, "train")
    assert stdout(notebook, "train").count("ran in Dask worker tcp://") == 2
    assert "same pixels as one process: True" in stdout(notebook, "predict")
    assert (work / "04-dask" / "run" / "model.pt").is_file()


@pytest.mark.slow  # ~15 s: synth one scene, sample, estimate, change
def test_area_and_change_notebook_estimates_and_finds_the_known_change(work: Path) -> None:
    notebook = execute("05_area_and_change.ipynb", cwd=NOTEBOOK_DIR)

    assert_figures(notebook, "05_area_and_change.ipynb")
    assert "transition matrix exact: True" in stdout(notebook, "change")
    assert stdout(notebook, "estimate").count("covered: ") == 4
    assert (work / "05-area-and-change" / "change" / "change.tif").is_file()
