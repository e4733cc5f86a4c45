"""A stage is one frozen config, built once by whoever launches it, that reaches its ranks as
published JSON: built alike by the command and `cluster launch`, inputs resolved there, the
tile size one field checked once, and read back by a rank as the very object."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.cli.cluster import cluster_stage
from landcover.errors import LandcoverError
from landcover.prediction.config import PredictConfig
from landcover.prediction.region import parse_region
from landcover.stageconfig import (
    PredictStage,
    TileStage,
    publish_stage,
    read_stage,
    remove_published,
    stage_url,
)
from tiling.sources.stacquery import StacSource
from tiling.tiler.config import TileConfig

SECRET = {"account_name": "acct", "account_key": "c2VjcmV0LWtleQ=="}


def launched(*args: str) -> PredictStage | TileStage:
    """The stage `cluster launch cluster.json -- ARGS` builds."""
    stage = cluster_stage(click.Context(main, info_name="landcover", obj={}), list(args))
    assert stage is not None
    return stage


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (("--tile-size", "8"), "--tile-size 8 px: must be at least 16"),
        (("--tile-size", "64", "--max-pixels", "1000"), "--tile-size 64 px makes tiles of 4,096"),
        (("--tile-size", "64", "--probabilities", "p.tif"), "--probabilities p.tif: a tiled"),
    ],
)
def test_the_tile_size_is_a_config_field_checked_once_for_every_builder(
    extra: tuple[str, ...], said: str
) -> None:
    """The command, `cluster launch` and the library's config refuse a bad tile size in the
    same words: the one check is `PredictConfig`'s."""
    args = ["predict", "m.pt", "a.tif", "--out", "tiles/", *extra]
    cli = CliRunner().invoke(main, args)
    assert cli.exit_code == 2 and cli.stderr.startswith(f"error: {said}"), cli.stderr
    with pytest.raises(LandcoverError, match=said.replace("+", r"\+")):
        launched(*args)
    options = dict(zip(extra[::2], extra[1::2], strict=True))
    with pytest.raises(LandcoverError, match=said):
        PredictConfig(
            model="m.pt",
            images=("a.tif",),
            out="tiles/",
            tile_px=int(options["--tile-size"]),
            max_pixels=int(options.get("--max-pixels", 10**9)),
            probabilities=options.get("--probabilities"),
        )


def test_the_launcher_resolves_the_inputs_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage holds the files the globs matched, not the globs: no rank globs again."""
    monkeypatch.chdir(tmp_path)
    for name in ("b.tif", "a.tif"):
        (tmp_path / name).write_bytes(b"")
    tile = launched("tile", "*.tif", "--out", "s.zarr")
    predict = launched("predict", "m.pt", "*.tif", "--out", "tiles/", "--tile-size", "64")
    assert isinstance(tile, TileStage) and isinstance(predict, PredictStage)
    assert tile.config.images == predict.config.images == ("a.tif", "b.tif")
    assert predict.config.tile_px == 64 and predict.tiled


def test_a_published_stage_is_read_back_as_the_same_object_without_its_secrets(
    tmp_path: Path, triangle_region: Path
) -> None:
    """Region (its geometry's WKB, exact), STAC items, tile size and every option go through
    the file; the storage options do not, and come back from the rank's environment."""
    config = PredictConfig(
        model="m.pt",
        images=("a.tif", "b.tif"),
        out=f"{tmp_path}/tiles/",
        region=parse_region(str(triangle_region)),
        tile_px=64,
        block_px=40,
        storage_options=SECRET,
    )
    source = StacSource(
        "a.tif", "item-a", "naip", datetime(2021, 6, 1, tzinfo=UTC), None, "https://x/a.json"
    )
    stage = PredictStage(config, (source,), quicklook=True)
    url = publish_stage(stage)
    assert url == stage_url(stage) == f"{tmp_path}/tiles.parts/{Path(url).name}"
    text = Path(url).read_text()
    assert SECRET["account_key"] not in text and "acct" not in text
    assert json.loads(text)["config"]["tile_px"] == 64
    assert read_stage(url, storage_options=SECRET) == stage
    tile = TileStage(TileConfig(images=("a.tif",), out=f"{tmp_path}/s.zarr", labels=("l.tif",)))
    assert read_stage(publish_stage(tile)) == tile
    remove_published(url)
    assert not (tmp_path / "tiles.parts").exists()


@pytest.fixture
def triangle_region(tmp_path: Path) -> Path:
    """A GeoJSON triangle in UTM 18N with coordinates no decimal text keeps exactly."""
    path = tmp_path / "triangle.geojson"
    ring = [[500000.123456789, 4000000.1], [500070.987654321, 4000000.3], [500010.5, 4000080.7]]
    path.write_text(
        json.dumps(
            {
                "type": "Polygon",
                "coordinates": [[*ring, ring[0]]],
                "crs": {"type": "name", "properties": {"name": "EPSG:26918"}},
            }
        )
    )
    return path


@pytest.mark.parametrize("place", ["elsewhere", "another.tif.parts", "v.tif.parts/sub"])
def test_a_stage_file_is_read_only_from_its_own_staging_area(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: str
) -> None:
    """A byte-exact copy of a stage file (its digest right) outside `<out>.parts/` is refused in
    one line: a rank would otherwise run a job no launcher watches, into that stage's output.
    The file itself is read by its relative, absolute or file:// name."""
    monkeypatch.chdir(tmp_path)
    stage = TileStage(TileConfig(images=("a.tif",), out="v.tif", labels=("l.tif",)))
    url = publish_stage(stage)
    copy = tmp_path / place / Path(url).name
    copy.parent.mkdir(parents=True)
    copy.write_bytes(Path(url).read_bytes())
    with pytest.raises(LandcoverError, match=r"read only from its staging area v\.tif\.parts/"):
        read_stage(str(copy))
    for name in (url, str(tmp_path / url), f"file://{tmp_path / url}"):
        assert read_stage(name) == stage
