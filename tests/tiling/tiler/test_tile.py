"""Tiling end to end: round trips, edges, labels, statistics, splits, resume, real NAIP."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from affine import Affine
from pyproj import Transformer
from rasterio.crs import CRS

from tests.support.chipstores import config, interrupt_after_first_source, snapshot
from tests.tiling.rasters import ALBERS, Scenes, write_nlcd_cover, write_raster
from tiling.chipstore.store import ChipStore, open_store
from tiling.errors import (
    LabelError,
    SourceChangedError,
    StorageAccessError,
    StoreError,
    StoreExistsError,
    TilingError,
)
from tiling.sources.classes import get_class_map
from tiling.sources.grid import chip_offsets
from tiling.tiler.tile import TileConfig, plan_tiling, tile

ALPHA_NIR = ("m_3211605_ne_11_060_20200415.tif", "m_4208701_ne_16_060_20200902.tif")


def reassemble(store: ChipStore, source_id: int) -> np.ndarray:
    """Paste every chip of a source at its index offsets; -1 where no chip landed."""
    record = next(s for s in store.summary.sources if s.id == source_id)
    h, w = record.shape
    c = store.summary.chip_size
    canvas = np.full((4, h, w), -1, dtype=np.int16)
    index = store.index()
    ids = np.flatnonzero(index[:, 0] == source_id)
    images, _ = store.read_chips(ids)
    for chip, (_, row, col, _) in zip(images, index[ids], strict=True):
        region = canvas[:, row : row + c, col : col + c]
        assert ((region == -1) | (region == chip)).all(), "overlapping chips disagree"
        region[...] = chip
    return canvas


def test_chips_reassembled_at_their_offsets_give_back_the_source(
    scenes: Scenes, tmp_path: Path
) -> None:
    out = tmp_path / "rt.zarr"
    tile(config(scenes.images, out, stride=48))
    store = open_store(str(out))
    for source_id, pixels in enumerate(scenes.image_pixels):
        assert np.array_equal(reassemble(store, source_id), pixels)
    with rasterio.open(scenes.images[0]) as ds:
        record = store.summary.sources[0]
        assert Affine(*record.transform) == ds.transform
        assert CRS.from_wkt(record.crs) == ds.crs
        assert record.shape == (ds.height, ds.width)


def test_edge_chips_are_flush_with_the_image_edges(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "edges.zarr"
    tile(config(scenes.images[:1], out))  # 300 x 413 px, 64 px chips
    index = open_store(str(out)).index()
    assert sorted(set(index[:, 1])) == [0, 64, 128, 192, 236]
    assert sorted(set(index[:, 2])) == [0, 64, 128, 192, 256, 320, 349]
    assert len(index) == 5 * 7


def test_an_image_smaller_than_the_chip_is_skipped_with_a_warning(
    scenes: Scenes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "big.zarr"
    with caplog.at_level("WARNING", logger="tiling"):
        result = tile(config(scenes.images, out, chip_size=300))  # b.tif is 257 px tall
    assert f"{scenes.images[1]}: 257 x 390 px is smaller than --chip-size 300; skipped" in (
        caplog.text
    )
    assert [s.path for s in result.summary.sources] == [str(scenes.images[0])]
    assert result.summary.complete and result.summary.num_chips == 2  # 300 x 413: 1 x 2


def test_a_run_where_every_image_is_too_small_fails_before_writing(
    scenes: Scenes, tmp_path: Path
) -> None:
    out = tmp_path / "huge.zarr"
    with pytest.raises(
        TilingError,
        match=r"every image is smaller than --chip-size 500 \(the largest, .*a.tif, is "
        r"300 x 413 px\); pass --chip-size 300 or smaller",
    ):
        tile(config(scenes.images, out, chip_size=500))
    assert not out.exists()


def test_labels_follow_the_image_grid_and_counts_and_stats_are_exact(
    scenes: Scenes, tmp_path: Path
) -> None:
    out = tmp_path / "labels.zarr"
    cfg = config(
        scenes.images,
        out,
        labels=(str(scenes.root / "labels" / "*.tif"),),
        class_map="chesapeake7to5",
        min_valid=0.6,
    )
    result = tile(cfg)
    store = open_store(str(out))
    s = store.summary
    assert result.summary == s and s.complete and s.has_labels
    images, labels = store.read_chips(store.chip_ids("all"))
    assert labels is not None
    index = store.index()
    # every kept chip of image A has labels equal to the 7→5 remap of the label tiles
    cmap = get_class_map("chesapeake7to5")
    with rasterio.open(scenes.chesapeake[1]) as west, rasterio.open(scenes.chesapeake[0]) as east:
        mosaic = np.concatenate(
            [
                cmap.apply(west.read(1)[10:310, 10:260]),
                cmap.apply(east.read(1)[10:310, 0:163], nodata=15),
            ],
            axis=1,
        )
    for k in np.flatnonzero(index[:, 0] == 0):
        _, r, c, _ = index[k]
        assert np.array_equal(labels[k], mosaic[r : r + 64, c : c + 64])
    # statistics over valid pixels of kept chips, recomputed from the stored chips
    valid = (images != 0).any(axis=1)
    assert s.class_counts == tuple(np.bincount(labels.ravel(), minlength=5))
    assert (labels[~valid] == 0).all(), "no label where the image has no data"
    for band in range(4):
        values = images[:, band][valid].astype(np.int64)
        assert s.band_stats.sums[band] == int(values.sum())
        assert s.band_stats.sums_sq[band] == int((values * values).sum())
        assert s.band_mean[band] == pytest.approx(values.mean(), rel=1e-12)
        assert s.band_std[band] == pytest.approx(values.std(), rel=1e-9)
    assert s.band_stats.count == int(valid.sum())
    # --min-valid: every kept chip has ≥ 60 % valid image and label pixels, and some of
    # image B's chips over its nodata corner were dropped
    assert (valid.mean(axis=(1, 2)) >= 0.6).all()
    assert ((labels != 0).mean(axis=(1, 2)) >= 0.6).all()
    assert s.sources[1].chips < 5 * 7


def test_labels_from_a_30_m_albers_raster_are_warped_onto_the_image(
    scenes: Scenes, tmp_path: Path
) -> None:
    out = tmp_path / "nlcd.zarr"
    tile(config(scenes.images[1:], out, labels=(str(scenes.nlcd),), class_map="nlcd"))
    store = open_store(str(out))
    images, labels = store.read_chips(store.chip_ids("all"))
    assert labels is not None
    with rasterio.open(scenes.nlcd) as ds:
        raw, inv = ds.read(1), ~ds.transform
    with rasterio.open(scenes.images[1]) as ds:
        transform = ds.transform
    to_albers = Transformer.from_crs("EPSG:26918", ALBERS, always_xy=True)
    cmap = get_class_map("nlcd")
    checked = 0
    for k, (_, r, c, _) in enumerate(store.index()):
        rows, cols = np.mgrid[r : r + 64, c : c + 64]
        xs, ys = transform @ (cols + 0.5, rows + 0.5)
        lc, lr = inv @ to_albers.transform(xs, ys)
        expected = cmap.apply(raw[np.floor(lr).astype(int), np.floor(lc).astype(int)])
        expected[(images[k] == 0).all(axis=0)] = 0
        frac = np.stack([lr % 1, lc % 1])
        ambiguous = (np.minimum(frac, 1 - frac) < 1e-3).any(axis=0)
        assert not ((labels[k] != expected) & ~ambiguous).any()
        checked += 1
    assert checked == store.summary.num_chips > 20


def test_split_is_by_ground_blocks_and_matches_the_plan(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "split.zarr"
    cfg = config(scenes.images, out, val_fraction=0.3, split_block_chips=2)
    plan = plan_tiling(cfg)
    tile(cfg, plan=plan)
    store = open_store(str(out))
    s = store.summary
    assert (s.num_train, s.num_val) == (plan.max_train, plan.max_val)
    assert 0 < s.num_val < s.num_chips
    assert s.split_block_m == 128.0  # 2 chips x 64 px x 1 m
    index = store.index()
    splits: dict[tuple[int, int], set[int]] = {}
    for source in plan.sources:
        rows = index[index[:, 0] == source.id]
        row_of = {o: i for i, o in enumerate(source.grid.row_offsets)}
        col_of = {o: j for j, o in enumerate(source.grid.col_offsets)}
        for _, r, c, split in rows:
            bx, by = source.blocks[row_of[r], col_of[c]]
            splits.setdefault((int(bx), int(by)), set()).add(int(split))
    assert all(len(v) == 1 for v in splits.values()), "a block is split between sets"
    assert np.array_equal(store.chip_ids("val"), np.flatnonzero(index[:, 3] == 1))


def test_worker_count_does_not_change_a_byte(scenes: Scenes, tmp_path: Path) -> None:
    kw = {"labels": (str(scenes.nlcd),), "class_map": "nlcd", "val_fraction": 0.2}
    tile(config(scenes.images, tmp_path / "k1.zarr", workers=1, **kw))
    tile(config(scenes.images, tmp_path / "k3.zarr", workers=3, **kw))
    assert snapshot(str(tmp_path / "k1.zarr"), {}) == snapshot(str(tmp_path / "k3.zarr"), {})


def test_rerun_after_a_crash_between_sources_equals_an_uninterrupted_run(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = [scenes.images[1], scenes.images[0], scenes.images[1].parent / "b.tif"]
    kw = {"labels": (str(scenes.nlcd),), "class_map": "nlcd", "shard_size": 3}
    tile(config(images[:2], tmp_path / "whole.zarr", **kw))
    interrupt_after_first_source(config(images[:2], tmp_path / "resumed.zarr", **kw), monkeypatch)
    partial = open_store(str(tmp_path / "resumed.zarr")).summary
    assert [s.id for s in partial.sources] == [0] and not partial.complete
    result = tile(config(images[:2], tmp_path / "resumed.zarr", **kw))
    assert (result.sources_resumed, result.sources_written) == (1, 1)
    assert snapshot(str(tmp_path / "whole.zarr"), {}) == snapshot(
        str(tmp_path / "resumed.zarr"), {}
    )


@pytest.mark.slow  # ~5 s: three CLI processes
def test_a_killed_subprocess_resumes_to_the_same_store(scenes: Scenes, tmp_path: Path) -> None:
    """A real SIGKILL in the middle of writing, not a polite exception."""
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from tiling.chipstore.writer import ChipStoreWriter\n"
        "real = ChipStoreWriter.append_encoded\n"
        "calls = [0]\n"
        "def append(self, *a):\n"
        "    real(self, *a); calls[0] += 1\n"
        "    if calls[0] == 3: os.kill(os.getpid(), 9)\n"
        "ChipStoreWriter.append_encoded = append\n"
        "from landcover.cli.app import main\n"
        "main(sys.argv[1:])\n"
    )

    def args(out: str) -> list[str]:
        return [
            "tile",
            str(scenes.images[0]),
            str(scenes.images[1]),
            "--out",
            str(tmp_path / out),
            "--chip-size",
            "64",
            "--shard-size",
            "3",
            "--min-valid",
            "0",
            "--workers",
            "2",
        ]

    killed = subprocess.run(
        [sys.executable, "-c", code, *args("k.zarr")], capture_output=True, timeout=120
    )
    assert killed.returncode == -9
    assert not open_store(str(tmp_path / "k.zarr")).summary.complete
    for out in ("k.zarr", "clean.zarr"):
        done = subprocess.run(
            [sys.executable, "-m", "landcover.cli.app", *args(out)],
            capture_output=True,
            timeout=120,
            text=True,
        )
        assert done.returncode == 0, done.stderr
    assert snapshot(str(tmp_path / "k.zarr"), {}) == snapshot(str(tmp_path / "clean.zarr"), {})


def test_bad_label_values_leave_nothing_a_rerun_would_trust(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "bad.zarr"
    cfg = config(scenes.images, out, labels=(str(scenes.nlcd),), class_map="chesapeake7to5")
    with pytest.raises(
        LabelError,
        match=r"nlcd.tif: label values \[.*\] are not in class map "
        r"'chesapeake7to5'; choose another --class-map",
    ):
        tile(cfg)
    summary = open_store(str(out)).summary
    assert summary.num_chips == 0 and not summary.complete
    with pytest.raises(
        StoreExistsError,
        match=r"written with other options \(class_map "
        r"chesapeake7to5 \(now nlcd\)\)",
    ):
        tile(config(scenes.images, out, labels=(str(scenes.nlcd),), class_map="nlcd"))


def test_labels_missing_an_image_are_refused_before_writing(scenes: Scenes, tmp_path: Path) -> None:
    out = tmp_path / "nolabels.zarr"
    with pytest.raises(LabelError, match=r"b.tif: no label raster overlaps it"):
        tile(config(scenes.images, out, labels=(str(scenes.chesapeake[1]),)))
    assert not out.exists()


def test_identity_class_map_needs_the_number_of_classes(scenes: Scenes, tmp_path: Path) -> None:
    with pytest.raises(TilingError, match=r"--class-map identity needs --num-classes K"):
        plan_tiling(
            config(
                scenes.images, tmp_path / "x.zarr", labels=(str(scenes.nlcd),), class_map="identity"
            )
        )


def test_num_classes_without_the_identity_map_is_refused(scenes: Scenes, tmp_path: Path) -> None:
    with pytest.raises(
        TilingError,
        match=r"--num-classes 7 applies only to --class-map identity \(got --class-map nlcd\); "
        "drop --num-classes or pass --class-map identity",
    ):
        plan_tiling(
            config(
                scenes.images,
                tmp_path / "x.zarr",
                labels=(str(scenes.nlcd),),
                class_map="nlcd",
                num_classes=7,
            )
        )


def test_storage_options_for_local_paths_only_are_refused(scenes: Scenes, tmp_path: Path) -> None:
    options = {"account_name": "x", "acount_key": "typo"}
    message = (
        r"--storage-options \(account_name, acount_key\) do not apply to local paths such "
        r"as .*; drop --storage-options"
    )
    with pytest.raises(StorageAccessError, match=message):
        plan_tiling(config(scenes.images, tmp_path / "x.zarr", storage_options=options))
    assert not (tmp_path / "x.zarr").exists()


def test_a_directory_that_is_not_a_store_is_never_overwritten(
    scenes: Scenes, tmp_path: Path
) -> None:
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("x")
    with pytest.raises(
        StoreExistsError,
        match="is a non-empty directory that is not a chip store; choose another --out",
    ):
        tile(config(scenes.images, tmp_path / "precious", overwrite=True))
    assert (tmp_path / "precious" / "thesis.tex").exists()


def test_real_naip_files_tile_images_only(real_naip_paths: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "naip.zarr"
    result = tile(config(real_naip_paths, out, min_valid=0.9))
    store = open_store(str(out))
    assert result.summary.num_chips == store.summary.num_chips
    assert not store.summary.has_labels
    for record in store.summary.sources:
        h, w = record.shape
        full_grid = len(chip_offsets(h, 64, 64)) * len(chip_offsets(w, 64, 64))
        assert record.chips == full_grid, f"{record.path}: no pixel of these files is nodata"
        if Path(record.path).name in ALPHA_NIR:
            canvas = reassemble(store, record.id)
            with rasterio.open(record.path) as ds:
                assert np.array_equal(canvas, ds.read()), "NIR (tagged alpha) must be kept"
        assert CRS.from_wkt(record.crs).to_epsg() == rasterio.open(record.path).crs.to_epsg()
    assert len({CRS.from_wkt(r.crs).to_epsg() for r in store.summary.sources}) == 5


def test_real_naip_file_tiles_with_synthetic_nlcd_labels(
    real_naip_dir: Path, tmp_path: Path
) -> None:
    image = real_naip_dir / "m_4112001_sw_10_060_20220716.tif"  # 22 m, UTM 10N
    nlcd = write_nlcd_cover(tmp_path / "nlcd.tif", (image,), seed=9)
    out = tmp_path / "naip_labels.zarr"
    tile(config([image], out, labels=(str(nlcd),), class_map="nlcd", min_valid=0.9))
    store = open_store(str(out))
    _, labels = store.read_chips(store.chip_ids("all"))
    assert labels is not None
    assert store.summary.num_chips == len(chip_offsets(340, 64, 64)) * len(
        chip_offsets(262, 64, 64)
    )
    assert (labels != 0).mean() > 0.99
    assert set(np.unique(labels)) <= {1, 2, 3, 4}
    assert sum(store.summary.class_counts) == labels.size


def test_real_naip_with_nodata_drops_chips_over_nodata(real_naip_dir: Path, tmp_path: Path) -> None:
    source = real_naip_dir / "m_3610332_se_13_060_20200903-downsampled.tif"  # nodata 0
    with rasterio.open(source) as ds:
        data, profile = ds.read(), ds.profile
    data[:, :100, :100] = 0  # a nodata corner, as at the edge of a NAIP quarter quad
    holed = tmp_path / "holed.tif"
    with rasterio.open(holed, "w", **profile) as ds:
        ds.write(data)
    out = tmp_path / "holed.zarr"
    tile(config([holed], out, min_valid=0.9))
    index = open_store(str(out)).index()
    expected = {
        (r, c)
        for r in chip_offsets(233, 64, 64)
        for c in chip_offsets(192, 64, 64)
        if max(0, 100 - r) * max(0, 100 - c) <= 0.1 * 64 * 64  # nodata px inside the chip
    }
    assert {(int(r), int(c)) for _, r, c, _ in index} == expected
    assert len(expected) == 4 * 3 - 4  # the four chips over the corner are dropped


def collared_copy(real_naip_dir: Path, tmp_path: Path) -> Path:
    """A real NAIP file with no nodata tag, given the black collar NAIP quads have."""
    source = real_naip_dir / "m_4112001_sw_10_060_20220716.tif"  # 340 x 262, no nodata tag
    with rasterio.open(source) as ds:
        assert ds.nodata is None
        data, profile = ds.read(), ds.profile
    data[:, :, :80] = 0  # the collar
    path = tmp_path / "collar.tif"
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(data)
    return path


def test_black_collar_of_a_file_without_nodata_is_not_imagery(
    real_naip_dir: Path, tmp_path: Path
) -> None:
    image = collared_copy(real_naip_dir, tmp_path)
    nlcd = write_nlcd_cover(tmp_path / "nlcd.tif", (image,), seed=9)
    kw: dict[str, Any] = {"labels": (str(nlcd),), "class_map": "nlcd", "min_valid": 0.5}
    tile(config([image], tmp_path / "zero.zarr", **kw))
    store = open_store(str(tmp_path / "zero.zarr"))
    index = store.index()
    images, labels = store.read_chips(store.chip_ids("all"))
    assert labels is not None
    # chips at col 0 (all collar) are dropped, col 64 (16 of 64 columns collar) is kept
    assert sorted(set(index[:, 2].tolist())) == [64, 128, 192, 198]
    invalid = (images == 0).all(axis=1)
    assert invalid.any(), "col 64..79 is collar inside kept chips"
    assert (labels[invalid] == 0).all(), "no label where the image is black fill"
    s = store.summary
    assert s.band_stats.count == int((~invalid).sum())
    assert s.sources[0].mask_kind == "zero"
    # opting out keeps the collar as imagery (the old behaviour)
    tile(config([image], tmp_path / "kept.zarr", zero_is_nodata=False, **kw))
    kept = open_store(str(tmp_path / "kept.zarr"))
    assert kept.summary.num_chips == len(chip_offsets(340, 64, 64)) * len(chip_offsets(262, 64, 64))
    assert kept.summary.sources[0].mask_kind == "none"
    with pytest.raises(StoreExistsError, match=r"options \(zero_is_nodata True \(now False\)"):
        tile(config([image], tmp_path / "zero.zarr", zero_is_nodata=False, **kw))


def test_invalid_pixels_are_stored_as_zero_in_every_band(scenes: Scenes, tmp_path: Path) -> None:
    data = scenes.image_pixels[0].copy()
    data[:, 64:90, :64] = 255  # declared nodata (255) in all four bands: stored as 0
    path = write_raster(tmp_path / "n255.tif", data, nodata=255)
    tile(config([path], tmp_path / "n.zarr", min_valid=0.0))
    store = open_store(str(tmp_path / "n.zarr"))
    images, _ = store.read_chips(np.flatnonzero(store.index()[:, 1] == 64))
    chip = images[0]  # rows 64..127, cols 0..63: rows 64..89 are nodata
    assert (chip[:, :26] == 0).all() and (chip[:, 26:] != 0).any(axis=0).all()


def test_resume_refuses_a_source_that_changed_since_it_was_tiled(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import shutil

    images = [tmp_path / "a.tif", tmp_path / "b.tif"]
    for src, dst in zip(scenes.images, images, strict=True):
        shutil.copy(src, dst)
    kw: dict[str, Any] = {"labels": (str(scenes.nlcd),), "class_map": "nlcd"}
    out = tmp_path / "stale.zarr"
    interrupt_after_first_source(config(images, out, **kw), monkeypatch)
    # a touch alone (same bytes, new mtime) is a change: nothing tells it from a rewrite
    stat = os.stat(images[0])
    os.utime(images[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    message = (
        rf"{images[0]} changed since it was tiled into {out} \(modification time\); its "
        "chips would be stale: pass --overwrite to rebuild the store"
    )
    with pytest.raises(SourceChangedError, match=message):
        tile(config(images, out, **kw))
    # a.tif (done) rewritten in place with other pixels, same size
    window = rasterio.windows.Window(0, 0, 10, 10)
    with rasterio.open(images[0], "r+") as ds:
        ds.write(np.full((4, 10, 10), 9, dtype=np.uint8), window=window)
    with pytest.raises(SourceChangedError, match=r"a.tif changed since .*content\)"):
        tile(config(images, out, **kw))
    result = tile(config(images, out, overwrite=True, **kw))
    assert result.summary.complete and result.sources_resumed == 0


def test_resume_refuses_a_label_raster_that_changed(
    scenes: Scenes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    nlcd = tmp_path / "nlcd.tif"
    shutil.copy(scenes.nlcd, nlcd)
    kw: dict[str, Any] = {"labels": (str(nlcd),), "class_map": "nlcd"}
    out = tmp_path / "stale-labels.zarr"
    interrupt_after_first_source(config(scenes.images, out, **kw), monkeypatch)
    write_nlcd_cover(nlcd, scenes.images, seed=99)  # new labels under the same name
    with pytest.raises(SourceChangedError, match=rf"{nlcd} changed since it was tiled"):
        tile(config(scenes.images, out, **kw))


def test_band_count_and_dtype_errors_surface_through_tile(tmp_path: Path) -> None:
    bad = write_raster(tmp_path / "three.tif", np.ones((3, 80, 80), dtype=np.uint8))
    with pytest.raises(TilingError, match=r"three.tif: expected 4 bands \(R, G, B, NIR\), found 3"):
        tile(config([bad], tmp_path / "x.zarr"))
    assert not (tmp_path / "x.zarr").exists()


def test_store_errors_are_tiling_errors() -> None:
    assert issubclass(StoreError, TilingError) and issubclass(StoreExistsError, FileExistsError)


@pytest.mark.azurite
def test_images_and_labels_read_from_az_urls(scenes: Scenes, tmp_path: Path, azurite: Any) -> None:
    import fsspec

    fs = fsspec.filesystem("az", **azurite.storage_options)
    prefix = f"{azurite.container}/inputs-{tmp_path.name}"
    fs.put(str(scenes.root / "naip") + "/", f"{prefix}/naip/", recursive=True)
    fs.put(str(scenes.nlcd), f"{prefix}/nlcd/nlcd.tif")
    remote = TileConfig(
        images=(f"az://{prefix}/naip/*.tif",),
        labels=(f"az://{prefix}/nlcd",),
        out=str(tmp_path / "remote.zarr"),
        chip_size=64,
        shard_size=4,
        min_valid=0.0,
        class_map="nlcd",
        storage_options=azurite.storage_options,
    )
    local = config(
        scenes.images, tmp_path / "local.zarr", labels=(str(scenes.nlcd),), class_map="nlcd"
    )
    result = tile(remote)
    tile(local)
    assert [s.path for s in result.summary.sources] == [
        f"az://{prefix}/naip/a.tif",
        f"az://{prefix}/naip/b.tif",
    ]

    def chip_objects(url: str) -> dict[str, bytes]:  # the source records name the inputs
        return {k: v for k, v in snapshot(url, {}).items() if "/c/" in k and "sources/" not in k}

    assert chip_objects(str(tmp_path / "remote.zarr")) == chip_objects(str(tmp_path / "local.zarr"))


@pytest.mark.azurite
def test_resume_refuses_an_az_source_that_changed(
    scenes: Scenes, tmp_path: Path, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fsspec

    fs = fsspec.filesystem("az", **azurite.storage_options)
    prefix = f"{azurite.container}/changed-{tmp_path.name}"
    fs.put(str(scenes.root / "naip") + "/", f"{prefix}/naip/", recursive=True)
    remote = replace(
        config([], tmp_path / "az.zarr", storage_options=azurite.storage_options),
        images=(f"az://{prefix}/naip/*.tif",),
    )
    interrupt_after_first_source(remote, monkeypatch)
    fs.put(str(scenes.images[1]), f"{prefix}/naip/a.tif")  # a.tif (done) replaced by b.tif
    with pytest.raises(
        SourceChangedError,
        match=rf"az://{prefix}/naip/a.tif changed since it was tiled into .*az.zarr \(size ",
    ):
        tile(remote)
