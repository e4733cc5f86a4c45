"""The class of issue 41: an error raised inside a task, a rank or a thread reaches the user as
the one line one process prints.

Each bad input (a tile source whose pixels are corrupt, a prediction input whose VRT member
is missing) is run four ways: in one process, as `--nproc 2` ranks, as the ranks of an engine
(`cluster launch local.json`) and as tasks on a Dask cluster (`cluster launch dask.json`).
Every way ends with exit status 2 and the same last line, naming the file and GDAL's reason;
no traceback, no "internal error".
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import distributed
import pytest
import rasterio
import rasterio.shutil
from click.testing import CliRunner

from cluster.failures import first_worker_error, read_worker_errors, record_worker_error
from landcover.cli.train import worker_command
from tests.support.stageruns import run, tile_args
from tests.tiling.rasters import image_pixels, write_raster


@pytest.fixture(scope="module")
def dask_json(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cluster.json naming a LocalCluster of two workers in this process (threads: the
    errors travel through Dask's pickling all the same)."""
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
        dashboard_address=None,
    ) as cluster:  # fmt: skip
        path = tmp_path_factory.mktemp("dask") / "dask.json"
        spec = {"engine": "dask", "targetNodeCount": 1, "processesPerNode": 2,
                "dask": {"scheduler": cluster.scheduler_address}}  # fmt: skip
        path.write_text(json.dumps(spec))
        yield path


@pytest.fixture(scope="module")
def local_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cluster.json of the local engine: two ranks on this machine."""
    path = tmp_path_factory.mktemp("local") / "local.json"
    spec = {"name": "two", "engine": "local", "vmSize": "local", "targetNodeCount": 1,
            "processesPerNode": 2}  # fmt: skip
    path.write_text(json.dumps(spec))
    return path


def corrupt_pixels(path: Path) -> None:
    """Keep `path`'s header and smash its first compressed block: it opens, then fails to
    read (as a download cut short or a bad disk sector does)."""
    with rasterio.open(path) as src:
        offset = int(src.get_tag_item("BLOCK_OFFSET_0_0", "TIFF", bidx=1))
        size = int(src.get_tag_item("BLOCK_SIZE_0_0", "TIFF", bidx=1))
    data = bytearray(path.read_bytes())
    data[offset + size // 4 : offset + size - 4] = b"\xab" * (size - 4 - size // 4)
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def corrupt_sources(images: Path) -> Path:
    """The four scenes of the tile tests, the third with corrupt pixels."""
    folder = images.parent / "corrupt"
    shutil.copytree(images, folder)
    with rasterio.open(folder / "c.tif") as src:
        transform, crs = src.transform, src.crs.to_string()
    write_raster(folder / "c.tif", image_pixels(70, 90, seed=3), crs=crs, transform=transform)
    corrupt_pixels(folder / "c.tif")
    return folder


@pytest.fixture(scope="module")
def missing_member(predict_inputs: tuple[Path, Path, Path]) -> Path:
    """A VRT over a copy of the prediction scene, the copy then deleted."""
    scene = predict_inputs[0]
    member = scene.parent / "member.tif"
    shutil.copy(scene, member)
    vrt = scene.parent / "scene.vrt"
    rasterio.shutil.copy(member, vrt, driver="VRT")
    vrt.write_text(
        vrt.read_text().replace(f'relativeToVRT="0">{member}<', 'relativeToVRT="1">member.tif<')
    )
    member.unlink()
    return vrt


def tile_corrupt(corrupt_sources: Path, inputs: Any, out: Path) -> list[str]:
    return tile_args(corrupt_sources, out / "s.zarr")


def predict_missing_member(missing_member: Path, inputs: Any, out: Path) -> list[str]:
    model = inputs[1]
    return [
        "predict", str(model), str(missing_member), "--out", f"{out}/product/",
        "--tile-size", "32", "--block-px", "40", "--batch-size", "3", "--device", "cpu",
        "--no-quicklook",
    ]  # fmt: skip


CASES: dict[str, tuple[Callable[..., list[str]], str, str]] = {
    # case: (arguments, the fixture of its bad input, what the line must name)
    "tile a corrupt source": (tile_corrupt, "corrupt_sources", "c.tif: cannot read pixels ("),
    "predict a missing VRT member": (
        predict_missing_member,
        "missing_member",
        "cannot open a file it refers to (",
    ),
}
WAYS = ("one process", "--nproc 2", "engine ranks", "dask tasks")


@pytest.mark.slow  # per case: 2 rank processes, a cluster's 2 ranks and a local Dask cluster
@pytest.mark.parametrize("case", list(CASES))
def test_an_error_in_a_unit_is_the_line_of_one_process(
    case: str,
    predict_inputs: Any,
    dask_json: Path,
    local_json: Path,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """Before: on Dask the error came back as `Exception("SourceFormatError(...)")`, an
    "internal error" after two retries and a traceback per try in the workers' log; the
    reason was rasterio's "Read failed. See previous exception for details."."""
    make_args, fixture, named = CASES[case]
    bad_input = request.getfixturevalue(fixture)
    lines = {}
    for way in WAYS:
        args = make_args(bad_input, predict_inputs, tmp_path / way.replace(" ", "-"))
        if way == "--nproc 2":
            args = [*args, "--nproc", "2"]
        elif way == "engine ranks":  # the local engine of a cluster.json, two ranks
            args = ["cluster", "launch", str(local_json), "--", *args]
        elif way == "dask tasks":
            args = ["cluster", "launch", str(dask_json), "--", *args]
        result = run("-q", *args)
        assert result.exit_code == 2, (way, result.output)
        assert "Traceback" not in result.output and "internal error" not in result.output
        lines[way] = result.output.strip().splitlines()[-1]
    assert lines["one process"].startswith("error: ") and named in lines["one process"], lines
    assert "member.tif" in lines["one process"] or "c.tif" in lines["one process"]
    assert "See previous exception" not in lines["one process"]
    assert lines["--nproc 2"] == lines["one process"], lines
    assert lines["engine ranks"] == lines["one process"], lines
    assert lines["dask tasks"] == lines["one process"], lines


def test_a_train_rank_that_refuses_its_input_is_the_cause_whatever_the_clocks_say(
    tmp_path: Path,
) -> None:
    """Before: a train rank's own error (a damaged shard) was recorded as a crash, so the
    launcher reported whichever record was older; the peer's "Connection closed by peer"
    (gloo) was often written first, while the failing rank tore down its process group, and
    `cluster launch` printed that as an internal error."""
    errors = tmp_path / "errors"
    errors.mkdir()
    store = tmp_path / "missing.zarr"
    env = {"LANDCOVER_ERROR_DIR": str(errors), "RANK": "0", "WORLD_SIZE": "1",
           "LOCAL_RANK": "0"}  # fmt: skip
    result = CliRunner(env=env).invoke(
        worker_command, [str(store), "--out", str(tmp_path / "run"), "--model", "small_unet"]
    )
    assert result.exit_code == 2, result.output
    record_worker_error(  # the peer, earlier
        "internal error: RuntimeError: Connection closed by peer",
        rank=1,
        environ={"LANDCOVER_ERROR_DIR": str(errors)},
    )
    peer = errors / "rank-1.error"
    record = json.loads(peer.read_text())
    peer.write_text(json.dumps({**record, "time_s": 0.0}))
    assert len(read_worker_errors(errors)) == 2
    cause = first_worker_error(errors)
    assert cause is not None and cause.rank == 0 and cause.bad_input, cause
    assert cause.message.startswith(f"{store}: ") and "internal error" not in cause.message
