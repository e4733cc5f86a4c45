"""Predictions with test-time adaptation (`predict --adapt`): the statistics recorded in the
map's tags and STAC items, the same bytes at any rank count and as tiles, the same classes
from torch and onnxruntime, and what an exported ONNX file takes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
from click.testing import CliRunner

import landcover
from landcover.cli.app import main
from landcover.errors import PredictionError
from landcover.prediction.adaptspec import TAG_ADAPT, TAG_ADAPT_SHA256, parse_adapt
from tests.support.exported import write_onnx
from tests.support.stageruns import predict_at_rank_counts
from tiling.synthetic.scenes import SynthResult

# -- predictions with adaptation ---------------------------------------------------------------

# (--adapt, --backend): the band statistics alone, BatchNorm after the bands, BatchNorm through
# the adapted model's ONNX export
ADAPTED_RUNS = [
    ("bands:1", "torch"),
    ("bn+bands:0.5", "torch"),
    pytest.param("bn:0.5", "onnxruntime", marks=pytest.mark.slow),  # the adapted model's export
]


@pytest.fixture()
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache (adapted models and their exports) in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg"


def _invoke(argv: list[str], env: dict[str, str] | None = None) -> None:
    result = CliRunner(env=env).invoke(main, argv)
    assert result.exit_code == 0, result.output


def _predict(args: list[str]) -> None:
    _invoke(["predict", *args])


def _read(path: Path) -> tuple[npt.NDArray[Any], dict[str, str]]:
    with rasterio.open(path) as ds:
        return ds.read(), ds.tags()


@pytest.mark.parametrize(("adapt", "backend"), ADAPTED_RUNS)
def test_adapted_maps_are_the_same_bytes_at_any_rank_count_and_as_tiles(
    adapt: str, backend: str, scene: Path, random_model: Path, tmp_path: Path, user_cache: Path
) -> None:
    """One process on 2 threads, 2 ranks on 1 thread each and a tiled product (other blocks
    and batches) with --adapt: the same bytes and the same recorded statistics; and not the
    map without adaptation."""
    common = ["--adapt", adapt, "--backend", backend, "--device", "cpu", "--no-quicklook"]
    args = ["predict", str(random_model), str(scene), "--block-px", "16", "--batch-size", "3"]
    runs = predict_at_rank_counts([*args, *common], tmp_path)
    assert runs[2].read_bytes() == runs[1].read_bytes()
    one, tags = _read(runs[1])
    assert tags[TAG_ADAPT] == str(parse_adapt(adapt))
    assert len(tags[TAG_ADAPT_SHA256]) == 64 and tags["LANDCOVER_BACKEND"] == backend
    tiles = tmp_path / "tiles"
    _predict([str(random_model), str(scene), "--out", f"{tiles}/", "--tile-size", "64",
              "--block-px", "40", "--batch-size", "5", *common])  # fmt: skip
    mosaic, _ = _read(tiles / "mosaic.vrt")
    np.testing.assert_array_equal(mosaic, one)
    tile = sorted(tiles.glob("*.tif"))[0]
    assert _read(tile)[1][TAG_ADAPT_SHA256] == tags[TAG_ADAPT_SHA256]
    item = json.loads(tile.with_suffix(".json").read_text())
    assert item["properties"]["landcover:adapt_sha256"] == tags[TAG_ADAPT_SHA256]
    plain = tmp_path / "plain.tif"
    _predict([str(random_model), str(scene), "--out", str(plain), "--backend", backend,
              "--device", "cpu", "--no-quicklook"])  # fmt: skip
    plain_map, plain_tags = _read(plain)
    assert (plain_map != one).any() and TAG_ADAPT not in plain_tags


@pytest.mark.slow  # the adapted model's export
def test_torch_and_onnxruntime_give_the_same_adapted_map_of_a_trained_model(
    adapted_trained: Path, tiny_scenes: SynthResult, tmp_path: Path, user_cache: Path
) -> None:
    """A trained model adapted (bn+bands) maps a whole 448 px scene: onnxruntime, running
    the adapted model's export, agrees with torch on at least 99.99 % of the pixels, both at
    the chip (`--window auto` gives onnxruntime larger windows than torch on the CPU)."""
    scene = str(tiny_scenes.image_paths[0])
    maps = {}
    for backend in ("torch", "onnxruntime"):
        out = tmp_path / f"{backend}.tif"
        _predict([str(adapted_trained), scene, "--out", str(out), "--backend", backend,
                  "--device", "cpu", "--no-quicklook", "--adapt", "bn+bands:0.5",
                  "--block-px", "256", "--window", "chip"])  # fmt: skip
        maps[backend] = _read(out)
    reference, tags = maps["torch"]
    counts = np.bincount(reference.ravel(), minlength=5)
    assert (counts[1:] > 0.02 * counts.sum()).sum() >= 2, counts  # boundaries to agree on
    assert float((maps["onnxruntime"][0] == reference).mean()) >= 0.9999
    assert maps["onnxruntime"][1][TAG_ADAPT_SHA256] == tags[TAG_ADAPT_SHA256]


@pytest.fixture(scope="module")
def adapted_trained(tiny_store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small_unet trained for 2 epochs on the tiny store (confident classes)."""
    run = landcover.train(
        tiny_store,
        tmp_path_factory.mktemp("adapt-trained") / "run",
        epochs=2,
        batch_size=8,
        threads=1,
        seed=3,
        device="cpu",
    )
    return run.run_dir / "model.pt"


def test_an_exported_onnx_file_takes_bands_and_refuses_bn_in_one_line(
    scene: Path, tmp_path: Path
) -> None:
    """An ONNX file has no BatchNorm buffers to adapt (its exporter folds them): `bn` is
    refused in one line, `bands` adapts the normalisation and is recorded."""
    model = write_onnx(tmp_path / "model.onnx", bands=4, classes=5)
    out = tmp_path / "lc.tif"
    args = [str(model), str(scene), "--out", str(out), "--device", "cpu", "--no-quicklook"]
    refused = CliRunner().invoke(main, ["predict", *args, "--adapt", "bn"])
    assert refused.exit_code != 0 and not out.exists()
    assert "--adapt bn" in refused.output and "Traceback" not in refused.output
    _predict([*args, "--adapt", "bands"])
    assert _read(out)[1][TAG_ADAPT] == str(parse_adapt("bands"))


def test_the_python_api_adapts_and_refuses_a_bad_value_in_one_line(
    scene: Path, random_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    landcover.predict(random_model, scene, out, adapt="bands:0.5", device="cpu")
    assert _read(out)[1][TAG_ADAPT] == "bands:0.5"
    with pytest.raises(PredictionError, match=r"--adapt 'bn:2': the strength"):
        landcover.predict(random_model, scene, tmp_path / "b.tif", adapt="bn:2", device="cpu")


@pytest.mark.slow  # the adapted model's export, twice
def test_a_truncated_adapted_model_in_the_cache_is_written_again(
    scene: Path, random_model: Path, tmp_path: Path, user_cache: Path
) -> None:
    """`--adapt bn` with onnxruntime saves the adapted model once in the user's cache; a copy
    of it cut short there is written again by the next run, not loaded (and refused)."""
    out = tmp_path / "lc.tif"
    args = [str(random_model), str(scene), "--out", str(out), "--device", "cpu", "--overwrite"]
    args += ["--no-quicklook", "--adapt", "bn", "--backend", "onnxruntime"]
    _predict(args)
    first = _read(out)
    (saved,) = (user_cache / "landcover" / "adapted").glob("*.pt")
    saved.write_bytes(saved.read_bytes()[:1000])
    _predict(args)
    again = _read(out)
    assert np.array_equal(again[0], first[0]) and again[1] == first[1]
