"""`landcover synth`, `landcover tile` and `landcover info` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from landcover.cli.app import main
from tests.tiling.rasters import Scenes, image_pixels, make_scenes, write_raster
from tests.tiling.stacfiles import raster_item, write_item_collection
from tiling.chipstore.store import FORMAT_VERSION, open_store


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Scenes:
    return make_scenes(tmp_path_factory.mktemp("cli-scenes"))


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def tile_args(scenes: Scenes, out: Path, *extra: str) -> list[str]:
    return [
        "tile",
        str(scenes.root / "naip" / "*.tif"),
        "--labels",
        str(scenes.root / "labels"),
        "--out",
        str(out),
        "--chip-size",
        "64",
        "--shard-size",
        "8",
        "--min-valid",
        "0.5",
        "--val-fraction",
        "0.25",
        *extra,
    ]


def test_tile_writes_a_store_and_info_describes_it(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "chips.zarr"
    result = run(*tile_args(scenes, out, "--workers", "2"))
    assert result.exit_code == 0, result.output
    summary = open_store(str(out)).summary
    assert (
        f"wrote {out}: {summary.num_chips} chips (train {summary.num_train}, "
        f"val {summary.num_val}) from 2 sources in" in result.output
    )
    assert "with 2 workers" in result.output

    info = run("info", str(out))
    assert info.exit_code == 0, info.output
    assert f"chips: {summary.num_chips} of 64 x 64 px (train {summary.num_train}, " in info.output
    assert f"format version {FORMAT_VERSION}, complete" in info.output
    assert "classes (chesapeake7to5):" in info.output and "tree canopy" in info.output
    assert "bytes on disk: " in info.output
    assert f"{scenes.root / 'naip' / 'a.tif'}  300 x 413 px" in info.output

    as_json = json.loads(run("info", str(out), "--json").output)
    assert as_json["chips"] == summary.num_chips
    assert (as_json["train"], as_json["val"]) == (summary.num_train, summary.num_val)
    assert as_json["format_version"] == FORMAT_VERSION and as_json["damaged"] == []
    assert [c["pixels"] for c in as_json["classes"]] == list(summary.class_counts)
    assert as_json["band_mean"] == pytest.approx(list(summary.band_mean))
    assert len(as_json["sources"]) == 2 and as_json["bytes_on_disk"] > 0


def test_dry_run_prints_the_plan_and_writes_nothing(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "dry.zarr"
    result = run(*tile_args(scenes, out, "--dry-run"))
    assert result.exit_code == 0, result.output
    # 300 x 413 → 5 x 7 chips; 257 x 390 → 5 x 7 chips
    assert "chips: up to 70 (train " in result.output
    assert "bytes: up to 1.4 MB uncompressed (images + labels), 20480 bytes per chip" in (
        result.output
    )
    lines = result.output.splitlines()
    assert [ln.split(":")[0].strip() for ln in lines[-4:]] == [
        "1 worker",
        "2 workers",
        "4 workers",
        "8 workers",
    ]
    assert not out.exists()


def test_rerunning_a_complete_store_says_what_to_do(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "again.zarr"
    assert run(*tile_args(scenes, out)).exit_code == 0
    again = run(*tile_args(scenes, out))
    assert again.exit_code == 2
    assert again.output.startswith(f"error: {out} exists and is complete (")
    assert "pass --overwrite to rebuild it or choose another --out" in again.output
    changed = run(*tile_args(scenes, out, "--stride", "32"))
    assert changed.exit_code == 2
    assert "exists and was written with other options (stride 64 (now 32))" in changed.output
    assert run(*tile_args(scenes, out, "--overwrite")).exit_code == 0


@pytest.mark.parametrize(
    ("make_input", "message"),
    [
        (
            lambda d: str(d / "nothing" / "*.tif"),
            "no image files match '{d}/nothing/*.tif'; check the path (quote globs",
        ),
        (
            lambda d: str(write_raster(d / "rgb.tif", image_pixels(90, 90, seed=0, bands=3))),
            "{d}/rgb.tif: expected 4 bands (R, G, B, NIR), found 3",
        ),
        (
            lambda d: str(
                write_raster(d / "u16.tif", image_pixels(90, 90, seed=0).astype(np.uint16))
            ),
            "{d}/u16.tif: expected uint8 pixels, found uint16; convert to 8-bit",
        ),
        (
            lambda d: str(write_raster(d / "nocrs.tif", image_pixels(90, 90, seed=0), crs=None)),
            "{d}/nocrs.tif: has no CRS; assign one",
        ),
        (
            lambda d: (d / "junk.tif").write_bytes(b"II*\x00garbage") and str(d / "junk.tif"),
            "{d}/junk.tif: not a readable GeoTIFF (",
        ),
        (
            lambda d: str(write_raster(d / "small.tif", image_pixels(40, 90, seed=0))),
            "every image is smaller than --chip-size 64 (the largest, {d}/small.tif, is "
            "40 x 90 px); pass --chip-size 40 or smaller",
        ),
    ],
    ids=["no-match", "bands", "dtype", "no-crs", "corrupt", "chip-too-large"],
)
def test_bad_images_give_one_line_and_exit_2(
    tmp_path: Path, make_input: object, message: str
) -> None:
    image = make_input(tmp_path)  # type: ignore[operator]
    out = tmp_path / "out.zarr"
    result = run("tile", image, "--out", str(out), "--chip-size", "64")
    assert result.exit_code == 2
    assert result.output.startswith("error: " + message.format(d=tmp_path))
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_labels_that_miss_an_image_and_bad_label_values(scenes: Scenes, tmp_path: Path) -> None:
    east_only = run(
        "tile", str(scenes.images[1]), "--labels", str(scenes.chesapeake[1]),
        "--out", str(tmp_path / "a.zarr"), "--chip-size", "64",
    )  # fmt: skip
    assert east_only.exit_code == 2
    assert f"error: {scenes.images[1]}: no label raster overlaps it (image bounds " in (
        east_only.output
    )
    wrong_map = run(
        "tile", str(scenes.images[1]), "--labels", str(scenes.nlcd),
        "--out", str(tmp_path / "b.zarr"), "--chip-size", "64",
    )  # fmt: skip
    assert wrong_map.exit_code == 2
    assert f"error: {scenes.nlcd}: label values [" in wrong_map.output
    assert "are not in class map 'chesapeake7to5'; choose another --class-map" in (wrong_map.output)


def test_invalid_storage_options_json_is_refused(scenes: Scenes, tmp_path: Path) -> None:
    result = run(*tile_args(scenes, tmp_path / "x.zarr", "--storage-options", "{account"))
    assert result.exit_code == 2
    assert "Invalid value for '--storage-options'" in result.output
    assert "not valid JSON (Expecting property name enclosed in double quotes at character 1)" in (
        result.output
    )
    assert "{account" not in result.output  # the value may hold a key: never echoed
    assert not (tmp_path / "x.zarr").exists()


def test_unreachable_azure_account_is_one_line(scenes: Scenes) -> None:
    options = json.dumps(
        {
            "connection_string": "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            "AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:9/devstoreaccount1;"
        }
    )
    result = run(
        "tile", str(scenes.images[0]), "--out", "az://chips/c.zarr", "--chip-size", "64",
        "--storage-options", options,
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.startswith(
        "error: az://chips/c.zarr: cannot reach storage account endpoint 127.0.0.1:9 ("
    )


def test_info_refuses_a_newer_format_and_a_missing_store(scenes: Scenes, tmp_path: Path) -> None:
    import zarr

    out = tmp_path / "newer.zarr"
    assert run(*tile_args(scenes, out)).exit_code == 0
    group = zarr.open_group(str(out), mode="r+")
    meta = dict(group.attrs["landcover_chips"])  # type: ignore[arg-type]
    group.update_attributes({"landcover_chips": {**meta, "version": FORMAT_VERSION + 1}})
    newer = run("info", str(out))
    assert newer.exit_code == 2
    assert newer.output == (
        f"error: {out}: chip store format version {FORMAT_VERSION + 1} is newer than this "
        f"landcover reads (version {FORMAT_VERSION}); upgrade landcover\n"
    )
    missing = run("info", str(tmp_path / "none.zarr"))
    assert missing.exit_code == 2
    assert "none.zarr: no chip store there; create one with `landcover tile" in missing.output


def test_synth_writes_scenes_and_says_where(tmp_path: Path) -> None:
    result = run("synth", str(tmp_path / "demo"), "--scenes", "1", "--size", "96", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert f"images in {tmp_path / 'demo' / 'naip'}, labels in {tmp_path / 'demo' / 'labels'}" in (
        result.output
    )
    assert len(list((tmp_path / "demo" / "naip").glob("*.tif"))) == 1


def test_two_small_scenes_get_a_val_split(tmp_path: Path) -> None:
    """Two small scenes (`synth --scenes 2 --size 512` tiled at 128 px) give a val split."""
    assert run("synth", str(tmp_path / "d"), "--scenes", "2", "--size", "512").exit_code == 0
    out = tmp_path / "c.zarr"
    result = run(
        "tile", str(tmp_path / "d" / "naip" / "*.tif"), "--labels",
        str(tmp_path / "d" / "labels" / "*.tif"), "--out", str(out), "--chip-size", "128",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    s = open_store(str(out)).summary
    assert s.num_val > 0 and s.num_train > 0
    assert f"(train {s.num_train}, val {s.num_val})" in result.output


def test_an_image_smaller_than_the_chip_is_skipped_and_counted(
    scenes: Scenes, tmp_path: Path
) -> None:
    small = write_raster(tmp_path / "sliver.tif", image_pixels(40, 90, seed=0))
    out = tmp_path / "s.zarr"
    result = run(
        "tile", str(scenes.images[0]), str(small), "--out", str(out), "--chip-size", "64",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "from 1 sources (1 image smaller than --chip-size skipped) in" in result.output


def test_no_zero_nodata_flag_keeps_black_pixels(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "keep.zarr"
    result = run(*tile_args(scenes, out, "--no-zero-nodata"))
    assert result.exit_code == 0, result.output
    sources = open_store(str(out)).summary.sources
    # a.tif declares no nodata: zero-fill applies unless opted out; b.tif declares 0
    assert [s.mask_kind for s in sources] == ["none", "nodata"]
    assert "--no-zero-nodata" in run("tile", "--help").output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ("--out", "/proc/x.zarr"),
            "error: /proc/x.zarr: cannot create the store there (No such file or directory); "
            "choose another --out",
        ),
        (
            ("--out", "{d}/n.zarr", "--num-classes", "5"),
            "error: --num-classes 5 applies only to --class-map identity (got --class-map "
            "chesapeake7to5); drop --num-classes or pass --class-map identity",
        ),
        (
            ("--out", "{d}/o.zarr", "--storage-options", '{"account_name": "x"}'),
            "error: --storage-options (account_name) do not apply to local paths such as ",
        ),
    ],
    ids=["unwritable-out", "num-classes", "local-storage-options"],
)
def test_bad_options_give_one_line_and_exit_2(
    scenes: Scenes, tmp_path: Path, extra: tuple[str, ...], message: str
) -> None:
    args = [a.replace("{d}", str(tmp_path)) for a in extra]
    result = run(
        "tile", str(scenes.images[0]), "--labels", str(scenes.root / "labels"),
        "--chip-size", "64", *args,
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.startswith(message)
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "n.zarr").exists() and not (tmp_path / "o.zarr").exists()


def test_info_refuses_storage_options_for_a_local_store(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "local.zarr"
    assert run(*tile_args(scenes, out)).exit_code == 0
    result = run("info", str(out), "--storage-options", '{"account_key": "k"}')
    assert result.exit_code == 2
    assert result.output == (
        f"error: --storage-options (account_key) do not apply to local paths such as {out}; "
        "drop --storage-options, or use a URL such as az://container/path\n"
    )


def test_info_reports_a_damaged_store_and_exits_2(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "damaged.zarr"
    assert run(*tile_args(scenes, out)).exit_code == 0
    assert run("info", str(out), "--verify").exit_code == 0
    (out / "labels" / "c" / "1" / "0" / "0").unlink()
    info = run("info", str(out))
    assert info.exit_code == 2
    assert f"store: {out} (format version {FORMAT_VERSION}, DAMAGED)" in info.output
    assert "labels shard 1 (chips 8..15)" in info.output
    assert info.output.splitlines()[-1] == (
        f"error: {out}: 1 shard object missing (labels shard 1 (chips 8..15)); the store is "
        f"damaged, re-tile with: landcover tile <the same inputs and options> --out {out} "
        "--overwrite"
    )
    as_json = run("info", str(out), "--json")
    assert as_json.exit_code == 2
    assert '"damaged": [\n    "labels shard 1 (chips 8..15)"' in as_json.output


def test_info_verify_finds_flipped_bytes(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "flipped.zarr"
    assert run(*tile_args(scenes, out)).exit_code == 0
    shard = out / "images" / "c" / "0" / "0" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[60] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert run("info", str(out)).exit_code == 0  # a listing cannot see it
    verified = run("info", str(out), "--verify")
    assert verified.exit_code == 2
    assert f"(format version {FORMAT_VERSION}, DAMAGED)" in verified.output
    assert verified.output.splitlines()[-1].startswith(
        f"error: {out}: chips 0..7 (images shard 0) corrupt: chip 0: chunk checksum does not "
        "match; the store is damaged"
    )


def test_tile_takes_a_stac_file_and_keeps_the_newest_flight_of_a_place(
    scenes: Scenes, tmp_path: Path
) -> None:
    older = tmp_path / "older" / "a.tif"
    older.parent.mkdir()
    older.write_bytes(scenes.images[0].read_bytes())
    doc = write_item_collection(
        [
            raster_item(older, item_id="a-2018", year=2018),
            raster_item(scenes.images[0], item_id="a-2021", year=2021),
            raster_item(scenes.images[1], item_id="b-2021", year=2021),
        ],
        tmp_path / "search.json",
    )
    out = tmp_path / "chips.zarr"
    args = tile_args(scenes, out)
    args[1] = str(doc)
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "from 2 sources" in result.output
    assert [s.path for s in open_store(str(out)).summary.sources] == [str(p) for p in scenes.images]


def test_tile_stac_options_that_cannot_work_are_one_line(scenes: Scenes, tmp_path: Path) -> None:
    out = str(tmp_path / "chips.zarr")
    cases = [
        (["--stac-api", "http://127.0.0.1:9/", "--bbox", "0,0,1,1"], "needs --collection NAME"),
        (["--stac-api", "http://127.0.0.1:9/", "--collection", "naip"], "give --bbox W,S,E,N"),
        ([str(scenes.images[0]), "--datetime", "2020"], "--datetime applies only to a STAC API"),
        (
            ["--stac-api", "http://127.0.0.1:9/", "--collection", "naip", "--bbox", "0,0,1,1"],
            "--stac-api http://127.0.0.1:9/: search failed",
        ),
        ([], "Missing argument 'IMAGES...'"),
    ]
    for args, message in cases:
        result = run("tile", *args, "--out", out)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
