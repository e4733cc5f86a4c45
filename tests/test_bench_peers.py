"""The peers benchmark's own arithmetic (benchmarks/bench_peers.py), without the peers: which
pixels count as near a window edge and as valid, the module every peer is handed, the tiled
whole-image reference, ours' rows, the done-when summary, and the state's hours that
bench_state.py derives from it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from landcover.models.modelfile import ModelMeta, save_model_file
from landcover.models.registry import build_model
from tiling.sources.classes import get_class_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_peers import EDGE_PX, SameWeights, near_window_edges  # type: ignore[import-not-found]
from resultfile import ResultTable  # type: ignore[import-not-found]


def test_seam_pixels_are_those_near_interior_window_edges() -> None:
    # two windows side by side on a 40 x 70 scene: one interior edge at column 32
    near = near_window_edges((40, 70), [(0, 0, 40, 32), (0, 32, 40, 38)])
    columns = np.flatnonzero(near.any(axis=0))
    assert (columns.min(), columns.max()) == (32 - EDGE_PX, 32 + EDGE_PX - 1)
    assert near[:, 32 - EDGE_PX : 32 + EDGE_PX].all()  # every row: the edge runs top to bottom
    assert not near[:, : 32 - EDGE_PX].any() and not near[:, 32 + EDGE_PX :].any()
    # a window flush with the scene's border has no seam there
    assert not near_window_edges((40, 70), [(0, 0, 40, 70)]).any()


def test_every_peer_gets_the_same_logits_and_never_class_0(tmp_path: Path) -> None:
    torch.manual_seed(0)
    class_map = get_class_map("chesapeake7to5")
    meta = ModelMeta(
        "small_unet", class_map, ("red", "green", "blue", "nir"), (100.0,) * 4, (50.0,) * 4,
        chip_size=32, resolution_m=1.0,
    )  # fmt: skip
    path = tmp_path / "m.pt"
    save_model_file(path, build_model("small_unet", num_classes=class_map.num_classes), meta)
    pixels = torch.randint(1, 256, (1, 4, 32, 32)).float()
    with torch.inference_mode():
        raw = SameWeights(str(path), scale=1.0).eval()(pixels.clone())
        scaled = SameWeights(str(path), scale=255.0).eval()(pixels / 255.0)
    torch.testing.assert_close(raw, scaled, rtol=1e-4, atol=1e-4)
    assert (raw.argmax(1) > 0).all()


def _model_file(tmp_path: Path, chip: int = 32) -> Path:
    torch.manual_seed(0)
    class_map = get_class_map("chesapeake7to5")
    meta = ModelMeta(
        "small_unet", class_map, ("red", "green", "blue", "nir"), (100.0,) * 4, (50.0,) * 4,
        chip_size=chip, resolution_m=1.0,
    )  # fmt: skip
    path = tmp_path / "m.pt"
    save_model_file(path, build_model("small_unet", num_classes=class_map.num_classes), meta)
    return path


def _image(tmp_path: Path, pixels: np.ndarray) -> str:
    import rasterio
    from rasterio.transform import from_origin

    path = tmp_path / "scene.tif"
    profile = {
        "driver": "GTiff", "width": pixels.shape[2], "height": pixels.shape[1], "count": 4,
        "dtype": "uint8", "crs": "EPSG:26918", "transform": from_origin(0, 0, 1, 1), "nodata": 0,
    }  # fmt: skip
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(pixels)
    return str(path)


class _Pointwise(torch.nn.Module):
    """A stand-in for SameWeights whose class at a pixel is its band 1's value in 50s: a
    misplaced tile shows as different classes."""

    def __init__(self, model_path: str, *, scale: float) -> None:
        super().__init__()

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return torch.stack([-((pixels[:, 0].float() - 50.0 * k) ** 2) for k in range(6)], 1)


def test_the_tiled_reference_puts_each_tile_where_one_pass_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench_peers

    monkeypatch.setattr(bench_peers, "SameWeights", _Pointwise)
    pixels = np.random.default_rng(0).integers(1, 256, (4, 100, 90), np.uint8)
    image = _image(tmp_path, pixels)
    whole = bench_peers.reference_classes("m.pt", image)
    # tiles of 32 px with 8 px of context, the last row and column cut short (100 x 90)
    monkeypatch.setattr(bench_peers, "REFERENCE_TILE_PX", 32)
    monkeypatch.setattr(bench_peers, "REFERENCE_CONTEXT_PX", 8)
    tiled = bench_peers.reference_classes("m.pt", image)
    assert len(np.unique(whole)) == 6  # every class: a misplaced tile cannot hide
    np.testing.assert_array_equal(tiled, whole)


def test_valid_pixels_leave_out_nodata_and_all_zero_pixels(tmp_path: Path) -> None:
    from bench_peers import valid_pixels  # type: ignore[import-not-found]

    pixels = np.full((4, 16, 16), 50, np.uint8)
    pixels[:, :2] = 0  # nodata (0 in every band)
    pixels[1:, 5, 5] = 0  # 0 in three bands only: data
    valid = valid_pixels(_image(tmp_path, pixels))
    assert not valid[:2].any() and valid[2:].all()


def test_ours_rows_are_every_backend_precision_and_window_with_int8_calibrated() -> None:
    from bench_peers import DEFAULTS, Variant, ours_variants  # type: ignore[import-not-found]

    variants = ours_variants([("torch", "fp32"), ("onnxruntime", "int8")])
    assert [v.name for v in variants] == [
        "torch-fp32-chip", "torch-fp32-auto", "onnxruntime-int8-chip", "onnxruntime-int8-auto",
    ]  # fmt: skip
    assert variants[1].args("s.zarr") == [
        "--backend", "torch", "--precision", "fp32", "--window", "auto",
    ]  # fmt: skip
    assert variants[2].args("s.zarr")[-2:] == ["--calibration", "s.zarr"]
    assert Variant(DEFAULTS).args("s.zarr") == []  # our defaults: no option at all


def _predict_table(ours: list[Any], peers: list[list[Any]], alone: float) -> ResultTable:
    from bench_peers import ALONE  # type: ignore[import-not-found]

    seam = f"agreement within {EDGE_PX} px of window edges"
    columns = ["model", "tool", "km²/min", "peak RSS MiB", seam]
    rows = [
        ["m", "ours (defaults)", *ours],
        ["m", ALONE, alone, 1, None],  # the limit: neither the fastest nor the leanest peer
        ["m", "ours torch-fp32-chip", 99.0, 1, 1.0],
    ]
    return ResultTable("predict", "t", columns, rows + [["m", *p] for p in peers])


@pytest.mark.parametrize(
    ("ours", "alone", "targets"),
    [
        ([30.0, 900, 0.9995], 32.0, "1.5x met, seam met, RSS met, 0.9x limit met"),
        ([29.0, 900, 0.9995], 32.0, "1.5x NOT met, seam met, RSS met, 0.9x limit met"),
        ([30.0, 1001, 0.9995], 32.0, "1.5x met, seam met, RSS NOT met, 0.9x limit met"),
        ([30.0, 900, 0.998], 32.0, "1.5x met, seam NOT met, RSS met, 0.9x limit met"),
        ([30.0, 900, 0.9995], 40.0, "1.5x met, seam met, RSS met, 0.9x limit NOT met"),
    ],
)
def test_the_summary_holds_ours_defaults_against_the_fastest_and_the_leanest_peer(
    ours: list[Any], alone: float, targets: str
) -> None:
    from bench_peers import summary  # type: ignore[import-not-found]

    peers = [["geoai", 5.0, 1000, 1.0], ["torchgeo", 20.0, 1500, 0.97]]
    table = summary(_predict_table(ours, peers, alone), side_px=64)
    (row,) = table.rows
    assert row[2] == "torchgeo 20.0" and row[6] == "geoai 1000"  # not ours' other rows
    assert row[3] == round(float(ours[0]) / 20.0, 2)
    assert row[7] == round(float(ours[0]) / alone, 2)  # ours / model alone
    assert row[-1] == targets


def test_the_state_hours_come_from_the_defaults_rate_and_the_cores(tmp_path: Path) -> None:
    from bench_state import NODE_CORES, STATE_KM2, hours_from_peers  # type: ignore[import-not-found]
    from resultfile import ResultFile, write_result_file  # type: ignore[import-not-found]

    summary = ResultTable("summary", "s", ["model", "ours km²/min"], [["m", 40.0], ["n", None]])
    path = tmp_path / "peers.json"
    write_result_file(path, ResultFile("bench_peers", "c", "CPU, 4 cores, Linux", "d", [summary]))
    table = hours_from_peers(str(path))
    assert table.rows[0][:3] == ["m", 40.0, round(STATE_KM2 / 40.0 / 60, 1)]
    per_node = 40.0 / 4 * NODE_CORES  # the rate of 4 cores, a node of NODE_CORES
    assert table.rows[0][3:] == [round(STATE_KM2 / (per_node * n) / 60, 2) for n in (1, 16, 64)]
    assert table.rows[1][1] is None  # a model without a rate has no hours
