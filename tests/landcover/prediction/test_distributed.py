"""Distributed prediction (landcover.prediction.distributed, parts, assemble): ranks started
here as threads calling `predict_region(config, rank=r, world_size=n)` write the COG a
one-process run writes, byte for byte; stale, half-written and finished parts; az:// outputs;
each rank's GPU (setup.rank_device).

The CLI's `predict --nproc` and a real SLURM launch are in tests/landcover/cli/test_predict.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import rasterio
import shapely
import torch
from rio_cogeo.cogeo import cog_validate

from landcover.errors import OutputExistsError, PredictionError
from landcover.prediction.parts import Staging
from landcover.prediction.region import parse_region
from landcover.prediction.runner import PredictConfig, PredictResult, predict_region
from landcover.prediction.setup import rank_device
from tests.azurite import Azurite
from tests.landcover.prediction.inputs import UTM18, read, write_model


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "random.pt", seed=7)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("models") / "other.pt", seed=8)


@pytest.fixture(scope="module")
def triangle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GeoJSON triangle over the scene whose edges cut across blocks and block rows."""
    shape = shapely.Polygon(
        [(500_003.0, 3_999_990.0), (500_085.0, 3_999_930.0), (500_010.0, 3_999_928.0)]
    )
    path = tmp_path_factory.mktemp("region") / "tri.geojson"
    feature = {"type": "Feature", "properties": {}, "geometry": shapely.geometry.mapping(shape)}
    path.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "crs": {"type": "name", "properties": {"name": UTM18}},
                "features": [feature],
            }
        )
    )
    return path


def run_ranks(config: PredictConfig, world_size: int) -> list[PredictResult]:
    """Every rank of a job, as threads; the results by rank (a rank's error is raised)."""
    with ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [
            pool.submit(predict_region, config, rank=rank, world_size=world_size)
            for rank in range(world_size)
        ]
        return [f.result(timeout=300) for f in futures]


def config_for(model: Path, scene: Path, out: Path, **options: Any) -> PredictConfig:
    return PredictConfig(str(model), (str(scene),), str(out), device="cpu", **options)


def outputs_bytes(*paths: Path | str | None) -> list[bytes]:
    return [Path(str(p)).read_bytes() for p in paths]


@pytest.mark.parametrize(("world_size", "block_px"), [(2, 16), (3, 40), (5, 40)])
def test_ranks_write_the_one_process_cog_byte_for_byte(
    scene: Path,
    random_model: Path,
    triangle: Path,
    tmp_path: Path,
    world_size: int,
    block_px: int,
) -> None:
    # 16 px blocks: 5 block rows, windows (32 px) reaching over several blocks of a row;
    # 40 px blocks: 2 block rows, so 3 and 5 ranks leave some ranks without rows.
    region = parse_region(str(triangle))
    one = config_for(
        random_model,
        scene,
        tmp_path / "one" / "lc.tif",
        region=region,
        probabilities=str(tmp_path / "one" / "p.tif"),
        block_px=block_px,
        batch_size=3,
    )
    many = dataclasses.replace(
        one, out=str(tmp_path / "many" / "lc.tif"), probabilities=str(tmp_path / "many" / "p.tif")
    )
    single = predict_region(one)
    results = run_ranks(many, world_size)
    assert outputs_bytes(one.out, one.probabilities) == outputs_bytes(many.out, many.probabilities)
    classes = read(Path(many.out))[0]
    assert len(np.unique(classes)) > 2  # nodata outside the triangle and several classes
    assert cog_validate(many.out)[0]
    # Rank 0 reports the whole grid, as one process does; the staging area is gone.
    assert (results[0].windows, results[0].class_pixels) == (single.windows, single.class_pixels)
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["lc.tif", "p.tif"]


def test_a_part_from_another_run_is_not_trusted(
    scene: Path, random_model: Path, other_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "many" / "lc.tif"
    one = config_for(random_model, scene, tmp_path / "one.tif", block_px=40)
    # Rank 1 of a run with another model leaves its committed part and returns.
    stale = config_for(other_model, scene, out, block_px=40)
    predict_region(stale, rank=1, world_size=2)
    assert any(n.endswith(".json") for n in Staging(str(out)).names())
    predict_region(one)
    run_ranks(dataclasses.replace(one, out=str(out)), 2)
    assert outputs_bytes(one.out) == outputs_bytes(out)
    assert not Path(str(out) + ".parts").exists()


def test_a_half_written_part_is_not_trusted_and_a_finished_one_is_kept(
    scene: Path, random_model: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "many" / "lc.tif"
    one = config_for(random_model, scene, tmp_path / "one.tif", block_px=16)  # 5 block rows
    many = dataclasses.replace(one, out=str(out))
    predict_region(one)
    # Ranks 1 and 2 of a 3-rank job finished before the job died; rank 2's part then lost
    # bytes (a copy cut short); a temporary file of a rank that was killed is left over.
    predict_region(many, rank=1, world_size=3)
    predict_region(many, rank=2, world_size=3)
    staging = Path(str(out) + ".parts")
    (part,) = staging.glob("part-00002-of-00003.*.tif")
    part.write_bytes(part.read_bytes()[:-10])
    (staging / f".{part.name}.deadbeef.tmp").write_bytes(b"half")
    with caplog.at_level(logging.INFO, logger="landcover.prediction"):
        run_ranks(many, 3)
    assert outputs_bytes(one.out) == outputs_bytes(out)
    assert "rank 1: keeping its finished part" in caplog.text
    assert "rank 2: keeping" not in caplog.text and "rank 2: wrote rows" in caplog.text
    assert f"ignoring {staging}" in caplog.text  # the cut part, named
    assert not staging.exists()


def test_a_rank_without_rows_leaves_its_threads_to_the_rank_with_rows(
    scene: Path, random_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One block row for two ranks of one machine: rank 0 predicts it with both ranks'
    threads, as one process would use the machine, then gives them back."""
    import landcover.prediction.runner as runner

    seen: list[int] = []
    predict_into = runner._predict_into

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return predict_into(*args, **kwargs)

    monkeypatch.setattr(runner, "_predict_into", spy)
    before = torch.get_num_threads()
    one = config_for(random_model, scene, tmp_path / "one.tif")  # one 2048 px block row
    predict_region(one)
    many = dataclasses.replace(one, out=str(tmp_path / "many.tif"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [
            pool.submit(predict_region, many, rank=r, world_size=2, local_ranks=range(2))
            for r in range(2)
        ]
        assert [f.result(timeout=300).windows for f in futures][1] == 0  # rank 1: no rows
    assert seen == [before, 2 * before]
    assert torch.get_num_threads() == before
    assert outputs_bytes(one.out) == outputs_bytes(many.out)


def test_ranks_refuse_a_rank_outside_the_world(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    config = config_for(random_model, scene, tmp_path / "lc.tif")
    with pytest.raises(
        PredictionError, match=r"rank 2 of world size 2: need 0 <= rank < world size"
    ):
        predict_region(config, rank=2, world_size=2)


@pytest.mark.azurite
def test_outputs_to_az_equal_local_ones_from_one_and_two_ranks(
    scene: Path, random_model: Path, triangle: Path, tmp_path: Path, azurite: Azurite
) -> None:
    region = parse_region(str(triangle))
    local = config_for(
        random_model,
        scene,
        tmp_path / "lc.tif",
        region=region,
        probabilities=str(tmp_path / "p.tif"),
        block_px=16,
    )
    predict_region(local)
    expected = outputs_bytes(local.out, local.probabilities)
    fs = fsspec.filesystem("az", **azurite.storage_options)
    for world_size in (1, 2):
        prefix = f"predict-{tmp_path.name}-{world_size}"
        remote = dataclasses.replace(
            local,
            out=azurite.url(f"{prefix}/lc.tif"),
            probabilities=azurite.url(f"{prefix}/p.tif"),
            storage_options=azurite.storage_options,
        )
        run_ranks(remote, world_size)
        fs.invalidate_cache()
        got = [fs.cat_file(f"{azurite.container}/{prefix}/{name}") for name in ("lc.tif", "p.tif")]
        assert got == expected, world_size
        assert sorted(fs.ls(f"{azurite.container}/{prefix}", detail=False)) == [
            f"{azurite.container}/{prefix}/lc.tif",
            f"{azurite.container}/{prefix}/p.tif",
        ]
        with pytest.raises(OutputExistsError, match=r"exists; pass --overwrite"):
            predict_region(remote)
    with rasterio.open(tmp_path / "lc.tif") as ds:
        assert ds.tags()  # class tags travel with the bytes compared above


def test_each_rank_of_a_job_takes_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [rank_device("auto", r) for r in (0, 1, 5)] == ["cuda:0", "cuda:1", "cuda:1"]
    assert rank_device("cuda", 2) == "cuda:2"
    assert rank_device("cuda:3", 1) == "cuda:3"  # a device the user named stays
    assert rank_device("cpu", 1) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rank_device("auto", 1) == "auto"  # resolved to cpu as in one process
