"""`predict --precision int8` (landcover.prediction.backends.quantize, .calibration): a model
file's ONNX export quantized once by onnxruntime, calibrated on a chip store's sample; the same
bytes at any rank count and as tiles, the calibration in the map's tags and the part keys, the
classes of a trained model close to fp32's, one line for every run it refuses, and a cache
that never trusts a file made of other inputs."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import rasterio
import torch
from click.testing import CliRunner

import landcover
from landcover.cli.app import main
from landcover.errors import PredictionError
from landcover.models.export import model_digest
from landcover.models.modelfile import load_model_file, save_model_file
from landcover.prediction import runtime
from landcover.prediction.backends import quantize
from landcover.prediction.backends.calibration import (
    CalibrationSample,
    calibration_sample,
    sample_chip_ids,
)
from landcover.prediction.backends.cpu import CpuFeatures, cpu_features
from landcover.prediction.backends.onnxcache import cached_onnx
from landcover.prediction.backends.quantize import cached_int8, int8_key, recorded_key
from landcover.prediction.choices import CALIBRATION_CHIPS, Precision
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.tiled import predict_product
from landcover.prediction.tileplan import TiledSetup
from tests.landcover.prediction.inputs import write_model
from tests.landcover.prediction.test_backends import model_dir, trained  # noqa: F401 (fixtures)
from tests.support.stageruns import predict_at_rank_counts
from tiling.chipstore.store import open_store
from tiling.synthetic.scenes import SynthResult
from tiling.tiler.tile import TileConfig, tile

# Runs an int8 model: refused on a CPU without int8 dot products. The refusals, the sample and
# the cache run anywhere (quantizing calibrates in fp32).
needs_vnni = pytest.mark.skipif(
    not cpu_features().int8, reason="this CPU has no int8 dot products (VNNI)"
)
VNNI = CpuFeatures(frozenset({"avx2", "avx512f", "avx512_vnni"}))


@pytest.fixture()
def user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's cache (int8 models) in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "landcover" / "int8"


def read(path: Path | str) -> tuple[npt.NDArray[Any], dict[str, str]]:
    with rasterio.open(path) as ds:
        return ds.read(), ds.tags()


def int8_map(model: Path, scene: Path, out: Path, store: str | None) -> npt.NDArray[Any]:
    config = PredictConfig(
        str(model), (str(scene),), str(out), device="cpu", precision="int8", calibration=store,
        block_px=256,
    )  # fmt: skip
    predict_region(config)
    classes: npt.NDArray[Any] = read(out)[0][0]
    return classes


# -- exactness and what the map records ------------------------------------------------------------


@needs_vnni
@pytest.mark.slow  # an export, a quantization and 2 rank processes
def test_int8_maps_are_the_same_bytes_at_any_rank_count_and_as_tiles(
    scene: Path,
    model_dir: Path,  # noqa: F811 (the fixture of test_backends)
    tiny_store: str,
    tmp_path: Path,
    user_cache: Path,
) -> None:
    """One process on 2 threads, 2 ranks on 1 thread each, and a tiled product (other blocks
    and batches): the same bytes, quantized once for all of them; the tags and the STAC item
    say int8, the store and the sample's digest."""
    common = ["--precision", "int8", "--calibration", tiny_store, "--device", "cpu",
              "--no-quicklook", "--batch-size", "3"]  # fmt: skip
    args = ["predict", str(model_dir / "model.pt"), str(scene), "--block-px", "16", *common]
    runs = predict_at_rank_counts(
        args, tmp_path, beside=lambda out: ["--stac-item", str(out.with_suffix(".json"))]
    )
    assert runs[2].read_bytes() == runs[1].read_bytes()
    one, tags = read(runs[1])
    assert len(np.unique(one)) >= 2  # class boundaries, where kernels could differ
    sample = calibration_sample(tiny_store, load_model_file(model_dir / "model.pt")[1],
                                model="m")  # fmt: skip
    assert (tags["LANDCOVER_BACKEND"], tags["LANDCOVER_PRECISION"]) == ("onnxruntime", "int8")
    assert tags["LANDCOVER_CALIBRATION"] == tiny_store
    assert tags["LANDCOVER_CALIBRATION_SHA256"] == sample.digest
    assert len(list(user_cache.glob("*.onnx"))) == 1  # quantized once, for every rank
    item = json.loads(runs[2].with_suffix(".json").read_text())["properties"]
    assert (item["landcover:precision"], item["landcover:calibration"]) == ("int8", tiny_store)
    assert item["landcover:calibration_sha256"] == sample.digest
    tiles = PredictConfig(
        str(model_dir / "model.pt"), (str(scene),), f"{tmp_path / 'tiles'}/", device="cpu",
        block_px=40, batch_size=5, precision="int8", calibration=tiny_store,
    )  # fmt: skip
    predict_product(TiledSetup(tiles, 64))
    mosaic, mosaic_tags = read(tmp_path / "tiles" / "mosaic.vrt")
    np.testing.assert_array_equal(mosaic, one)
    assert mosaic_tags["LANDCOVER_PRECISION"] == "int8"


@pytest.mark.slow  # quantizes a model
@needs_vnni
def test_an_int8_part_is_never_reused_for_fp32(
    scene: Path,
    model_dir: Path,  # noqa: F811 (the fixture of test_backends)
    tiny_store: str,
    tmp_path: Path,
    user_cache: Path,
) -> None:
    """The part keys hold the precision and the calibration's digest: an int8 rerun of an fp32
    job's output, and an fp32 rerun of an int8 one, predict again."""
    from landcover.prediction.distributed import pixel_settings
    from landcover.prediction.prepared import prepare_prediction

    settings = {}
    runs: list[tuple[Precision, str | None]] = [("fp32", None), ("int8", tiny_store)]
    for precision, store in runs:
        config = PredictConfig(
            str(model_dir / "model.pt"), (str(scene),), str(tmp_path / "lc.tif"), device="cpu",
            backend="onnxruntime", precision=precision, calibration=store,
        )  # fmt: skip
        prepared = prepare_prediction(config, torch.device("cpu"), max_pixels=None, quiet=True)
        settings[precision] = pixel_settings(prepared)
    assert settings["fp32"]["precision"] == "fp32" and settings["fp32"]["calibration"] is None
    digest = read_digest(tiny_store, model_dir / "model.pt")
    assert settings["int8"]["precision"] == "int8"
    assert settings["int8"]["calibration"] == f"{tiny_store}@{digest}"


def read_digest(store: str, model: Path) -> str:
    return calibration_sample(store, load_model_file(model)[1], model=str(model)).digest


# -- agreement with fp32 on a trained model ------------------------------------------------------


@needs_vnni
@pytest.mark.slow  # a trained model's export and quantization
def test_int8_classes_of_a_trained_model_agree_with_fp32(
    trained: Path,  # noqa: F811
    tiny_scenes: SynthResult,
    tiny_store: str,
    tmp_path: Path,
    user_cache: Path,
) -> None:
    """A trained small_unet on a whole 448 px scene, calibrated on its training store (the
    default: the model file records it): int8 agrees with fp32 on at least 95 % of the pixels.
    Static int8 keeps 256 levels per activation, so pixels near a tie between two classes
    flip, and a model trained for 2 epochs has many near-ties: its agreement varies with the
    training seed and the scene. The floor sits under that spread with a margin (other seeds,
    other onnxruntime versions) and still fails a broken quantization (a wrong scale or
    normalisation flips whole regions). int8 need not reach the 99.9 % that `--precision
    auto` would ask of it: auto stays fp32."""
    scene = Path(tiny_scenes.image_paths[0])
    fp32 = tmp_path / "fp32.tif"
    predict_region(
        PredictConfig(str(trained), (str(scene),), str(fp32), device="cpu", block_px=256)
    )
    reference = read(fp32)[0][0]
    counts = np.bincount(reference.ravel(), minlength=5)
    assert (counts[1:] > 0.02 * counts.sum()).sum() >= 2, counts  # boundaries to agree on
    int8 = int8_map(trained, scene, tmp_path / "int8.tif", None)
    assert read(tmp_path / "int8.tif")[1]["LANDCOVER_CALIBRATION"] == tiny_store
    assert float((int8 == reference).mean()) >= 0.95


# -- one line for what cannot run ------------------------------------------------------------------

NO_VNNI = CpuFeatures(frozenset({"avx2", "avx512f"}))
REFUSALS = {
    "torch": (
        ["--backend", "torch"],
        "error: --precision int8 --backend torch: int8 runs on onnxruntime's static "
        "quantization only; use --backend onnxruntime (or auto)",
    ),
    "no calibration": (
        ["--no-calibration"],
        "error: --precision int8: {model} needs chips to calibrate on; pass --calibration "
        "STORE, a chip store from `landcover tile`",
    ),
    "bad store": (
        ["--calibration", "{tmp}/missing.zarr"],
        "error: --calibration {tmp}/missing.zarr: {tmp}/missing.zarr: no chip store there; "
        "create one with `landcover tile IMAGES --out {tmp}/missing.zarr`",
    ),
    "store path with a line break": (  # the fix stays on the line, the break shown escaped
        ["--calibration", "{tmp}/miss\ning.zarr"],
        "error: --calibration {tmp}/miss\\ning.zarr: {tmp}/miss\\ning.zarr: no chip store "
        "there; create one with `landcover tile IMAGES --out {tmp}/miss\\ning.zarr`",
    ),
    "empty store name": (
        ["--calibration", ""],
        "error: --calibration '': give a chip store's path or URL (from `landcover tile`), or "
        "drop --calibration",
    ),
    "chips off the stride": (  # 40 px chips: a window edge the model never predicts
        ["--calibration", "{off_stride}"],
        "error: --calibration {off_stride}: its chips are 40 px, an edge the model never "
        "predicts (windows are multiples of 32 px); give a store tiled with --chip-size 32, "
        "the model's chip",
    ),
    "no vnni": (
        ["--no-vnni"],
        "error: --precision int8: this CPU has no int8 dot products (AVX-512 VNNI or "
        "AVX-VNNI; it has avx2, avx512f), where onnxruntime's int8 kernels saturate; use "
        "--precision fp32",
    ),
    "no onnxruntime": (
        ["--no-onnxruntime"],
        "error: --precision int8: onnxruntime is not installed; pip install onnx onnxruntime "
        "onnxscript (dependencies of landcover); or use --precision fp32",
    ),
    "onnx file": (
        ["--no-model-pt"],
        "error: --precision int8 quantizes a model file (model.pt), not {model} (an exported "
        "onnx file); predict with its model.pt",
    ),
    "adapt": (
        ["--adapt", "bands"],
        "error: --precision int8 with --adapt: the int8 model is calibrated for the model's "
        "own statistics, not adapted ones; use --adapt none, or --precision fp32",
    ),
}


@pytest.fixture(scope="module")
def off_stride_store(tiny_scenes: SynthResult, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A chip store of the tiny scenes in 40 px chips (not a multiple of the models' stride)."""
    url = str(tmp_path_factory.mktemp("off-stride") / "chips40.zarr")
    images, labels = (str(tiny_scenes.image_paths[0]),), (str(tiny_scenes.label_paths[0]),)
    tile(TileConfig(images=images, labels=labels, out=url, chip_size=40, workers=1))
    return url


@pytest.mark.parametrize("case", list(REFUSALS))
def test_every_int8_refusal_is_one_line_and_leaves_no_output(
    case: str,
    scene: Path,
    random_model: Path,
    tiny_store: str,
    off_stride_store: str,
    tmp_path: Path,
    user_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra, expected = REFUSALS[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    extra = [a.format(tmp=tmp_path, off_stride=off_stride_store) for a in extra]
    # every other refusal comes after the CPU's check, whatever CPU runs the test
    features = NO_VNNI if "--no-vnni" in extra else VNNI
    monkeypatch.setattr(runtime, "cpu_features", lambda: features)
    if "--no-onnxruntime" in extra:
        monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    model = random_model
    if "--no-model-pt" in extra:  # the model file's own export, given as the model
        model = cached_onnx(str(random_model))[0]
    calibration = [] if extra == ["--no-calibration"] else ["--calibration", tiny_store]
    flags = [a for a in extra if not a.startswith("--no-")]
    if "--calibration" in flags:
        calibration = []
    args = ["predict", str(model), str(scene), "--out", str(out_dir / "lc.tif"),
            "--precision", "int8", *calibration, *flags, "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert (
        result.output
        == expected.format(tmp=tmp_path, model=model, off_stride=off_stride_store) + "\n"
    )
    assert "Traceback" not in result.output
    assert list(out_dir.iterdir()) == []


@pytest.mark.parametrize("out", ["lc.tif", "tiles/"])
def test_storage_options_apply_to_a_remote_calibration_store_of_local_inputs(
    out: str, scene: Path, random_model: Path, tmp_path: Path, user_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """--storage-options reach a remote --calibration store of local model, images and map
    (refused as options of local paths), for one COG and a tiled product: its error shows."""
    monkeypatch.setattr(runtime, "cpu_features", lambda: VNNI)
    (out_dir := tmp_path / "out").mkdir()
    tiles, store = ["--tile-size", "64"] if out.endswith("/") else [], "memory://int8-missing.zarr"
    args = ["predict", str(random_model), str(scene), "--out", f"{out_dir}/{out}", *tiles,
            "--precision", "int8", "--calibration", store, "--device", "cpu",
            "--storage-options", '{"skip_instance_cache": true}']  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: --calibration {store}: {store}: no chip store there; create one with "
        f"`landcover tile IMAGES --out {store}`\n"
    )
    assert list(out_dir.iterdir()) == []


@pytest.mark.slow  # exports a model
def test_a_local_model_is_exported_for_a_run_with_storage_options(tmp_path: Path) -> None:
    """A local model file's ONNX export is made for a run whose --storage-options are its
    remote store's or images' (export refused them as options of local paths only)."""
    model = write_model(tmp_path / "model.pt", seed=7)
    path, _ = cached_onnx(str(model), storage_options={"skip_instance_cache": True})
    assert recorded_key(path) is None and path.is_file()


@pytest.mark.slow  # trains one epoch
def test_the_default_calibration_is_the_training_store_from_any_directory(
    tiny_store: str, off_stride_store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store given to train as a relative path is recorded absolute: int8's default
    calibration from another directory reads it, never a store of the same name there."""
    store = Path(tiny_store)
    monkeypatch.chdir(store.parent)
    run = landcover.train(store.name, tmp_path / "run", epochs=1, batch_size=8, threads=1,
                          device="cpu")  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(off_stride_store, elsewhere / store.name)  # another store, the same name
    monkeypatch.chdir(elsewhere)
    model, meta = run.run_dir / "model.pt", load_model_file(run.run_dir / "model.pt")[1]
    assert meta.training["store"] == str(store.resolve())
    assert calibration_sample(None, meta, model=str(model)).store == str(store.resolve())


def test_calibration_without_int8_is_one_line(scene: Path, random_model: Path) -> None:
    args = ["predict", str(random_model), str(scene), "--out", "lc.tif", "--calibration", "s.zarr"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: --calibration s.zarr: calibrates --precision int8 only (this run is --precision "
        "auto); drop --calibration or add --precision int8\n"
    )


# -- the calibration sample ---------------------------------------------------------------------


class ManyChips:
    """A stand-in store of `train` and `val` chip ids, as a state's store of thousands of
    sources has (only `chip_ids` is read)."""

    def __init__(self, train: int, val: int) -> None:
        self.ids = {"train": np.arange(train), "all": np.arange(train + val)}

    def chip_ids(self, split: str) -> npt.NDArray[np.int64]:
        return self.ids[split]


@pytest.mark.parametrize(("train", "val"), [(1_000_000, 250_000), (0, 5_000), (20, 0)])
def test_the_sample_of_a_store_of_any_size_is_at_most_32_chips_spread_end_to_end(
    train: int, val: int
) -> None:
    """One pass over the ids, whatever their number: 32 spread from the first train chip to
    the last (all chips where none is train; every chip of a store smaller than that)."""
    ids = sample_chip_ids(ManyChips(train, val))  # type: ignore[arg-type]
    every = train if train else train + val
    assert ids.size == min(32, every)
    assert ids[0] == 0 and ids[-1] == every - 1
    assert (np.diff(ids) > 0).all()


def test_the_calibration_sample_is_train_chips_spread_over_the_store_normalised_as_predict_does(
    tiny_store: str, random_model: Path
) -> None:
    store = open_store(tiny_store)
    train = store.chip_ids("train")
    ids = sample_chip_ids(store)
    assert len(ids) == CALIBRATION_CHIPS < len(train)  # the tiny store has more train chips
    assert (ids[0], ids[-1]) == (train[0], train[-1]) and set(ids) <= set(train)
    assert np.all(np.diff(ids) > 0)  # store order, no chip twice
    meta = load_model_file(random_model)[1]
    sample = calibration_sample(tiny_store, meta, model=str(random_model))
    images, _ = store.read_chips(ids)
    mean = np.asarray(meta.band_mean, np.float32)[:, None, None]
    std = np.asarray(meta.band_std, np.float32)[:, None, None]
    expected = np.where(images.any(axis=1, keepdims=True), (images - mean) / std, 0.0)
    np.testing.assert_allclose(sample.chips, expected, rtol=1e-6, atol=1e-6)
    again = calibration_sample(tiny_store, meta, model=str(random_model))
    assert again.digest == sample.digest and again.key == f"{tiny_store}@{sample.digest}"


# -- the cache ---------------------------------------------------------------------------------


@pytest.mark.slow  # two exports and four quantizations
def test_the_int8_model_is_made_once_per_model_and_sample_and_a_cut_file_is_made_again(
    model_dir: Path,  # noqa: F811
    tiny_store: str,
    tmp_path: Path,
    user_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Path(shutil.copy(model_dir / "model.pt", tmp_path / "model.pt"))
    fp32, digest = cached_onnx(str(model))
    sample = calibration_sample(tiny_store, load_model_file(model)[1], model=str(model))
    made: list[Path] = []
    real = quantize._quantize

    def counted(fp32_onnx: Path, out: Path, sample: CalibrationSample) -> None:
        made.append(out)
        real(fp32_onnx, out, sample)

    monkeypatch.setattr(quantize, "_quantize", counted)
    first = cached_int8(fp32, digest, sample)
    assert recorded_key(first) == int8_key(digest, sample.digest) and len(made) == 1
    assert cached_int8(fp32, digest, sample) == first and len(made) == 1  # found again
    # another sample (a changed store: other chips, other band statistics) is another file
    other = CalibrationSample(sample.store, sample.chips[:-1].copy(), "0" * 64)
    assert cached_int8(fp32, digest, other) != first and len(made) == 2
    # a file cut short (a full disk, a copy interrupted) is quantized again, not trusted
    whole = first.read_bytes()
    first.write_bytes(whole[: len(whole) // 2])
    assert recorded_key(first) is None
    assert cached_int8(fp32, digest, sample) == first and len(made) == 3
    assert first.read_bytes() == whole  # quantizing is deterministic
    # a retrained model is another file
    module, meta = load_model_file(model)
    with torch.no_grad():
        module.head.bias.add_(1.0)  # type: ignore[operator, union-attr]
    save_model_file(model, module, meta)
    fp32_new, new_digest = cached_onnx(str(model))
    assert new_digest != digest and model_digest(str(model)) == new_digest
    assert cached_int8(fp32_new, new_digest, sample) != first and len(made) == 4
    # another user's lock folder (the old shared name) is no obstacle; a directory: one line
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "landcover-locks").write_text("another user's")
    retrained = quantize.int8_cache_path(int8_key(new_digest, sample.digest))
    retrained.unlink()
    retrained.mkdir()
    with pytest.raises(PredictionError, match=rf"model {retrained} \(Is a directory\); remove"):
        cached_int8(fp32_new, new_digest, sample)
    assert not [p for p in user_cache.iterdir() if p.suffix == ".tmp"]  # no temp file left
