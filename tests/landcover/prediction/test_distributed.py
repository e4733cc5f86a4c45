"""Distributed prediction (landcover.prediction.distributed, parts, assemble): ranks started
here as threads calling `predict_region(config, rank=r, world_size=n)` write the COG a
one-process run writes, byte for byte; stale, half-written and finished parts; az:// outputs;
each rank's GPU (devices.rank_device).

The CLI's `predict --nproc` and a real SLURM launch are in tests/landcover/cli/test_predict.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import rasterio
import shapely
import torch
from click.testing import CliRunner
from rio_cogeo.cogeo import cog_validate

from landcover.cli.app import main
from landcover.devices import rank_device
from landcover.errors import OutputExistsError, PredictionError
from landcover.models.modelfile import load_model_file, save_model_file
from landcover.prediction.backends import cpu_features
from landcover.prediction.config import PredictConfig
from landcover.prediction.distributed import RERUN_KEEPS_PARTS, RERUN_PREDICTS_AGAIN
from landcover.prediction.parts import Staging
from landcover.prediction.region import parse_region
from landcover.prediction.runner import PredictResult, predict_region
from tests.azurite import Azurite
from tests.landcover.prediction.inputs import UTM18, read, write_model
from tests.support.prediction import config_for
from tests.support.stageruns import rank_args as stage_rank_args


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
    assert results[0].class_pixels == single.class_pixels
    # each rank starts its rows afresh: the windows above its first block row run again
    assert results[0].windows >= single.windows
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


def test_every_predict_option_is_one_a_rerun_predicts_again_for_or_one_it_keeps_parts_for() -> None:
    """A new PredictConfig field fails here until it is put in one of the two."""
    names = sorted(f.name for f in dataclasses.fields(PredictConfig))
    assert sorted(RERUN_PREDICTS_AGAIN + RERUN_KEEPS_PARTS) == names


# Each PredictConfig field's other value on a rerun (from the module's fixtures and tmp_path).
RERUN_VALUES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model": lambda f: str(f["other_model"]),
    "images": lambda f: (str(shutil.copy(f["scene"], f["tmp_path"] / "copy.tif")),),
    "out": lambda f: str(f["tmp_path"] / "elsewhere" / "lc.tif"),
    "region": lambda f: parse_region(str(f["triangle"])),
    "dst_crs": lambda f: "EPSG:3857",
    "resolution": lambda f: 2.0,
    "overlap_px": lambda f: 4,
    "window": lambda f: "32",  # the chip's edge as a number: the same windows (torch, CPU)
    "batch_size": lambda f: 3,
    "device": lambda f: "cuda",
    # auto runs these tiny predictions with torch: a part of onnxruntime's is another
    "backend": lambda f: "onnxruntime",
    "precision": lambda f: "bf16",
    # refused: calibrates int8 only (see the test); test_int8.py checks the keys hold it
    "calibration": lambda f: str(f["tmp_path"] / "chips.zarr"),
    "tta": lambda f: "flips",
    "adapt": lambda f: "bands",
    "probabilities": lambda f: str(f["tmp_path"] / "p.tif"),
    "overwrite": lambda f: True,
    "block_px": lambda f: 16,
    # local outputs take no storage options; credentials never change a pixel
    "storage_options": lambda f: {},
    "progress": lambda f: False,
    "max_pixels": lambda f: 10**7,
    "zero_is_nodata": lambda f: False,
    "pipeline": lambda f: False,
    "tile_px": lambda f: 64,  # refused: a one COG's config has no tile size (see the test)
}


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(PredictConfig)])
def test_a_rerun_with_another_option_predicts_again_or_keeps_the_finished_part(
    name: str,
    scene: Path,
    random_model: Path,
    other_model: Path,
    triangle: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 1 of a 2-rank job finished its part before the job died; the rerun changes one
    option: a part of another value is never reused, one of the same pixels is kept."""
    assert name in RERUN_VALUES, f"say which other value of {name} a rerun is tested with"
    base = config_for(random_model, scene, tmp_path / "lc.tif", block_px=40)
    if name == "tile_px":
        # A tile size makes a tiled product, which has tiles, not parts (its tiles' keys hold
        # the tile size): a one-COG job's rerun cannot be given one.
        value = RERUN_VALUES[name]({"tmp_path": tmp_path})
        with pytest.raises(PredictionError, match=f"--tile-size {value} needs --out to be a dir"):
            dataclasses.replace(base, tile_px=value)
        return
    if name == "calibration":
        # A calibration store calibrates --precision int8 only: a fp32 job's rerun cannot be
        # given one. An int8 part's key holds the store and its sample's digest (test_int8.py).
        value = RERUN_VALUES[name]({"tmp_path": tmp_path})
        with pytest.raises(PredictionError, match=f"--calibration {value}: calibrates"):
            dataclasses.replace(base, calibration=value)
        return
    if name == "precision" and not cpu_features().bf16:
        pytest.skip("this CPU has no native bf16: --precision bf16 is refused here")
    if name == "device" and not torch.cuda.is_available():
        # No other device type to run on here: the part's key is seen to hold the type.
        import landcover.prediction.distributed as distributed

        seen: list[Mapping[str, Any]] = []
        real_key = distributed.part_key

        def spy(settings: Mapping[str, Any], *args: Any) -> str:
            seen.append(settings)
            return real_key(settings, *args)

        monkeypatch.setattr(distributed, "part_key", spy)
        predict_region(base, rank=1, world_size=2)
        assert seen and all(s["device"] == "cpu" for s in seen)
        return
    predict_region(base, rank=1, world_size=2)
    fixtures = {"scene": scene, "other_model": other_model, "triangle": triangle}
    value = RERUN_VALUES[name]({**fixtures, "tmp_path": tmp_path})
    rerun = dataclasses.replace(base, **{name: value})
    with caplog.at_level(logging.INFO, logger="landcover.prediction"):
        run_ranks(rerun, 2)
    kept = "rank 1: keeping its finished part" in caplog.text
    if name == "window":  # the part's key holds the window's edge: 32 px is the chip's
        assert kept
        return
    assert kept == (name in RERUN_KEEPS_PARTS)
    assert Path(rerun.out).exists()


# -- every output at 1, 2 and 3 ranks, each rank count with its own threads ----------------------

# Ranks on one machine share its cores, so a rank runs with fewer torch threads than one process:
# 2 for one process, 1 each for 2 ranks, 3 each for 3 ranks (more than this machine's cores, but
# what counts is another number). On one thread torch runs small batches of a 1x1 convolution
# through another kernel, and on three it splits elementwise work at other places.
RANK_THREADS = {1: 2, 2: 1, 3: 3}
OUTPUTS = ("classes", "probabilities", "stac item", "directory")


@pytest.fixture(scope="module")
def offset_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random model with a large logit added to every class alike (softmax ignores it):
    the logits' last bits, which another kernel or summation order changes, then show in the
    probabilities of this small region, as they do now and then over a large one."""
    folder = tmp_path_factory.mktemp("models")
    module, meta = load_model_file(write_model(folder / "random.pt", seed=7))
    head: Any = module.head
    with torch.no_grad():
        weights = torch.rand(head.weight.shape[1], generator=torch.Generator().manual_seed(0))
        head.weight.add_(1e4 * weights.view(1, -1, 1, 1))
    save_model_file(folder / "offset.pt", module, meta)
    return folder / "offset.pt"


@pytest.fixture(scope="module")
def rank_outputs(
    scene: Path, offset_model: Path, triangle: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """The directory of `predict` (COG, probabilities, STAC item) run as 1, 2 and 3 ranks in
    rank mode, as an engine runs it, each rank count with its RANK_THREADS."""
    runs: dict[int, Path] = {}
    before = torch.get_num_threads()
    try:
        for world_size, threads in RANK_THREADS.items():
            folder = tmp_path_factory.mktemp(f"ranks-{world_size}")
            torch.set_num_threads(threads)
            args = [
                "predict", str(offset_model), str(scene), "--region", str(triangle),
                "--out", str(folder / "lc.tif"), "--probabilities", str(folder / "p.tif"),
                "--stac-item", str(folder / "lc.json"), "--block-px", "16",
                "--batch-size", "3", "--device", "cpu", "--no-quicklook",
            ]  # fmt: skip
            env = {
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",  # read, never dialled: the ranks share files only
                "MASTER_PORT": "29500",
                "LANDCOVER_ERROR_DIR": str(tmp_path_factory.mktemp("errors")),
            }
            for rank in [*range(1, world_size), 0]:  # rank 0 waits for the others' parts
                rank_args = stage_rank_args(*args) if world_size > 1 else args
                result = CliRunner(env={**env, "RANK": str(rank)}).invoke(main, rank_args)
                assert result.exit_code == 0, result.output
            runs[world_size] = folder
    finally:
        torch.set_num_threads(before)
    return runs


def output_of(folder: Path, output: str) -> Any:
    """One output of a run, as it is compared between rank counts."""
    if output == "classes":
        return (folder / "lc.tif").read_bytes()
    if output == "probabilities":
        return (folder / "p.tif").read_bytes()
    if output == "stac item":  # the time of writing and the item's own path are the run's
        item = json.loads((folder / "lc.json").read_text().replace(str(folder), "OUT"))
        for key in ("created", "datetime"):
            item["properties"].pop(key)
        return item
    return sorted(p.name for p in folder.iterdir())  # no parts, no lock, no temporary file


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("output", OUTPUTS)
def test_every_output_is_the_same_at_any_rank_count(
    rank_outputs: dict[int, Path], output: str, world_size: int
) -> None:
    """The region's block rows split among the ranks at boundaries inside blended overlaps
    (16 px blocks, 32 px windows overlapping by 8 px)."""
    one, many = rank_outputs[1], rank_outputs[world_size]
    assert output_of(many, output) == output_of(one, output)
    if output == "directory":
        assert output_of(one, output) == ["lc.json", "lc.tif", "p.tif"]
    if output == "probabilities":
        probabilities = read(one / "p.tif")[0]
        assert len(np.unique(probabilities)) > 10  # not one value: the offset keeps them apart
