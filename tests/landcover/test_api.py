"""The Python API (landcover.api): three calls give what the three commands give."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from click.testing import CliRunner
from shapely.geometry import box

import landcover
from cluster.errors import ClusterError
from landcover.cli import main
from landcover.errors import LandcoverError, RegionError
from tests.landcover.conftest import TINY_CHIP_PX
from tiling.chipstore.store import open_store
from tiling.synthetic.scenes import SynthResult


def _cli(*args: str) -> None:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output


def test_tile_train_predict_in_three_calls_match_the_commands(
    tiny_scenes: SynthResult, tmp_path: Path
) -> None:
    images = [str(p) for p in tiny_scenes.image_paths]
    labels = [str(p) for p in tiny_scenes.label_paths]
    options = {"chip_size": TINY_CHIP_PX, "shard_size": 16, "val_fraction": 0.25, "workers": 1}
    api_store = tmp_path / "api.zarr"
    landcover.tile(images, api_store, labels=labels, **options)
    cli_store = tmp_path / "cli.zarr"
    _cli("tile", *images, *(a for label in labels for a in ("--labels", label)),
         "--out", str(cli_store), "--chip-size", str(TINY_CHIP_PX), "--shard-size", "16",
         "--val-fraction", "0.25", "--workers", "1")  # fmt: skip
    api_summary, cli_summary = (
        open_store(str(api_store)).summary,
        open_store(str(cli_store)).summary,
    )
    assert (api_summary.num_train, api_summary.num_val) == (
        cli_summary.num_train,
        cli_summary.num_val,
    )
    assert api_summary.class_counts == cli_summary.class_counts

    train_options = {"epochs": 1, "batch_size": 8, "threads": 1, "seed": 3}
    run = landcover.train(api_store, tmp_path / "api-run", **train_options)
    _cli("train", str(cli_store), "--out", str(tmp_path / "cli-run"), "--epochs", "1",
         "--batch-size", "8", "--threads", "1", "--seed", "3")  # fmt: skip
    api_line = json.loads((run.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    cli_line = json.loads((tmp_path / "cli-run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert run.epochs_completed == 1
    # Same store content, seed and options: the same training, to the last digit on CPU.
    assert api_line["train_loss"] == cli_line["train_loss"]
    assert api_line["val_miou"] == cli_line["val_miou"]

    with rasterio.open(tiny_scenes.image_paths[0]) as src:
        west, south, _, _ = src.bounds
        crs = src.crs.to_string()
    bbox = (west + 50, south + 50, west + 250, south + 200)
    out = tmp_path / "api-map.tif"
    result = landcover.predict(
        run.run_dir / "model.pt", images[0], out, bbox=bbox, region_crs=crs, batch_size=4
    )
    cli_out = tmp_path / "cli-map.tif"
    bbox_text = ",".join(str(v) for v in bbox)
    _cli("predict", str(run.run_dir / "model.pt"), images[0], "--out", str(cli_out),
         "--bbox", bbox_text, "--region-crs", crs, "--batch-size", "4")  # fmt: skip
    assert result.valid_pixels > 0
    with rasterio.open(out) as api_map, rasterio.open(cli_out) as cli_map:
        assert api_map.crs == cli_map.crs and api_map.transform == cli_map.transform
        assert np.array_equal(api_map.read(1), cli_map.read(1))


def test_a_region_as_geojson_mapping_or_shapely_geometry(tiny_scenes: SynthResult) -> None:
    from landcover.api import _region

    with rasterio.open(tiny_scenes.image_paths[0]) as src:
        crs = src.crs.to_string()
        geometry = box(*src.bounds)
    from_geometry = _region(geometry, None, crs)
    from_mapping = _region({"type": "Feature", "geometry": geometry.__geo_interface__}, None, crs)
    assert from_geometry.geometry.equals(from_mapping.geometry)
    assert from_geometry.crs == from_mapping.crs
    with pytest.raises(LandcoverError, match="either region= or bbox="):
        _region(geometry, (0.0, 0.0, 1.0, 1.0), crs)
    with pytest.raises(RegionError, match="W < E"):
        _region(None, (1.0, 0.0, 0.0, 1.0), None)


def test_an_unknown_option_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(LandcoverError, match=r"unknown option 'epoch' for TrainConfig; use one of"):
        landcover.train(tmp_path / "store.zarr", tmp_path / "run", epoch=3)


@pytest.mark.parametrize(
    ("options", "config", "by_name"),
    [
        ("TileOptions", "tiling.tiler.config:TileConfig", {"images", "out", "labels"}),
        ("TrainOptions", "landcover.training.config:TrainConfig", {"store_url", "out_dir"}),
        (
            "PredictOptions",
            "landcover.prediction.config:PredictConfig",
            {"model", "images", "out", "region", "tile_px"},
        ),
    ],
)
def test_the_typed_options_are_the_config_fields_a_call_does_not_name(
    options: str, config: str, by_name: set[str]
) -> None:
    import dataclasses
    import importlib

    import landcover.apioptions

    module, name = config.split(":")
    fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}
    keys = set(getattr(landcover.apioptions, options).__annotations__)
    assert keys == fields - by_name


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda out: landcover.predict("m.pt", "a.tif", out / "p", tile_px="256"),
         "tile_px='256': predict takes tile_px as int | None, not a str"),
        (lambda out: landcover.predict("m.pt", "a.tif", out / "p.tif", batch_size=2.5),
         "batch_size=2.5: PredictConfig takes batch_size as int, not a float"),
        (lambda out: landcover.tile("a.tif", out / "s.zarr", chip_size=True),
         "chip_size=True: TileConfig takes chip_size as int, not a bool"),
        (lambda out: landcover.train("s.zarr", out / "run", epochs="3"),
         "epochs='3': TrainConfig takes epochs as int, not a str"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_is_one_line(call: Any, said: str, tmp_path: Path) -> None:
    """Before: `tile_px="256"` ended in a TypeError ("'<' not supported between instances of
    'str' and 'int'"), an internal error."""
    with pytest.raises(LandcoverError) as raised:
        call(tmp_path)
    assert str(raised.value) == said


def test_a_closed_client_is_one_line(tmp_path: Path) -> None:
    import distributed

    with (
        distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        pass
    with pytest.raises(ClusterError) as raised:
        landcover.tile("a.tif", tmp_path / "s.zarr", cluster=client)
    assert str(raised.value).startswith("the distributed.Client given is closed: pass an open")


@pytest.mark.parametrize(
    ("out", "tile_px", "said"),
    [
        ("map.tif", 256, "--tile-size 256 needs --out to be a directory for the tiles, e.g. "
         "--out map/ (with the trailing slash); drop --tile-size for one COG"),
        ("tiles/", None, "--out tiles/ is a directory (a tiled map product); give --tile-size "
         "PX, e.g. --tile-size 10000, or a file name like lc.tif for one COG"),
    ],
)  # fmt: skip
def test_out_and_tile_px_are_checked_as_the_command_checks_them(
    out: str, tile_px: int | None, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the API wrote a tiled product at "map.tif" and one COG named "tiles/", both of
    which `landcover predict` refuses."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LandcoverError) as raised:
        landcover.predict("m.pt", "a.tif", out, tile_px=tile_px)
    assert str(raised.value) == said
    tile_size = ["--tile-size", str(tile_px)] if tile_px else []
    cli = CliRunner().invoke(main, ["predict", "m.pt", "a.tif", "--out", out, *tile_size])
    assert cli.exit_code == 2 and cli.output.strip().splitlines()[-1] == f"error: {said}"
