"""Backends and precisions of a prediction (landcover.prediction.runtime, .backends): a model
file runs through torch or its cached ONNX export, in fp32 or bf16; the map records what ran,
is the same bytes at any rank count and as tiles for each backend, and the backends' maps of
a trained model agree."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Iterator
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
from landcover.errors import ExportError, ModelFileError, PredictionError
from landcover.models.export import model_digest
from landcover.models.modelfile import load_model_file, save_model_file
from landcover.prediction import runtime
from landcover.prediction.backends import cpu, onnxcache
from landcover.prediction.backends.cpu import CpuFeatures, parse_cpu_flags
from landcover.prediction.backends.onnxcache import cached_onnx, onnx_cache_path, recorded_digest
from landcover.prediction.choices import AUTO_ONNX_MIN_WINDOW_PIXELS
from landcover.prediction.config import PredictConfig
from landcover.prediction.runner import predict_region
from landcover.prediction.runtime import for_prediction, load_window_model
from landcover.prediction.tiled import predict_product
from landcover.prediction.tileplan import TiledSetup
from tests.landcover.prediction.inputs import CHIP, write_model
from tests.support.stageruns import predict_at_rank_counts
from tiling.synthetic.scenes import SynthResult

CPU = torch.device("cpu")
HAS_BF16 = cpu.cpu_features().bf16
# (backend, precision) of every way a model file runs on this CPU
RUNS = [("torch", "fp32"), ("onnxruntime", "fp32")] + [("torch", "bf16")] * HAS_BF16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random small_unet (seed 7) whose ONNX export is cached beside it once for the
    module."""
    folder = tmp_path_factory.mktemp("backend-models")
    write_model(folder / "model.pt", seed=7)
    return folder


@pytest.fixture(scope="module")
def trained(tiny_store: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small_unet trained for 2 epochs on the tiny store: a model with confident classes, as
    agreement between backends is meant for (a random model's near-ties flip on rounding)."""
    run = landcover.train(
        tiny_store,
        tmp_path_factory.mktemp("trained") / "run",
        epochs=2,
        batch_size=8,
        threads=1,
        seed=3,
        device="cpu",
    )
    return run.run_dir / "model.pt"


@pytest.fixture()
def quiet_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The user's cache of exports in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    yield tmp_path / "xdg" / "landcover" / "onnx"


def read(path: Path | str) -> tuple[npt.NDArray[Any], dict[str, str]]:
    with rasterio.open(path) as ds:
        return ds.read(), ds.tags()


def config_for(model: Path, scene: Path, out: Path | str, **options: Any) -> PredictConfig:
    return PredictConfig(str(model), (str(scene),), str(out), device="cpu", **options)


# -- what ran is in the map, and the export is made once -------------------------------------------


@pytest.mark.parametrize(("backend", "precision"), RUNS)
def test_the_map_records_the_backend_and_precision_that_ran(
    backend: str, precision: str, scene: Path, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    predict_region(
        config_for(model_dir / "model.pt", scene, out, backend=backend, precision=precision)
    )
    _, tags = read(out)
    provider = "CPUExecutionProvider" if backend == "onnxruntime" else "cpu"
    assert (tags["LANDCOVER_BACKEND"], tags["LANDCOVER_PRECISION"]) == (backend, precision)
    assert tags["LANDCOVER_PROVIDER"] == provider


def test_a_model_file_is_exported_once_beside_it_and_found_again(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = model_digest(str(model_dir / "model.pt"))
    path, got = cached_onnx(str(model_dir / "model.pt"))
    assert (path, got) == (model_dir / f"model.{digest[:16]}.onnx", digest)
    assert recorded_digest(path) == digest
    exports: list[str] = []
    monkeypatch.setattr(onnxcache, "export_model", lambda *a, **k: exports.append(a[0]))
    for _ in range(2):  # a later run, rank or tile finds it
        model, _ = load_window_model(str(model_dir / "model.pt"), backend="onnxruntime", device=CPU)
        assert model.inference.backend == "onnxruntime"
    assert exports == []
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(["model.pt", path.name])


@pytest.mark.slow  # three ONNX exports
def test_a_changed_model_is_exported_again_and_a_stale_export_never_trusted(
    tmp_path: Path, model_dir: Path
) -> None:
    model = shutil.copy(model_dir / "model.pt", tmp_path / "model.pt")
    cached, _ = cached_onnx(str(model_dir / "model.pt"))
    shutil.copy(cached, tmp_path)  # copied with its export: found beside it, not exported
    first, digest = cached_onnx(str(model))
    assert first == tmp_path / cached.name
    x = torch.randn(2, 4, CHIP, CHIP, generator=torch.Generator().manual_seed(0))
    # retrained in place: another digest, another file; the old export is removed
    module, meta = load_model_file(model)
    with torch.no_grad():
        module.head.bias.add_(1.0)  # type: ignore[operator, union-attr]
    save_model_file(model, module, meta)
    second, new_digest = cached_onnx(str(model))
    assert new_digest != digest and second != first and not first.exists()
    onnx_model, _ = load_window_model(str(model), backend="onnxruntime", device=CPU)
    torch.testing.assert_close(onnx_model(x), module(x), atol=1e-4, rtol=1e-4)
    # a file at the cache's name that records another model (copied there, or damaged) is
    # exported over, never run
    shutil.copy(cached, second)
    assert recorded_digest(second) != new_digest
    again, _ = cached_onnx(str(model))
    assert again == second and recorded_digest(second) == new_digest
    second.write_bytes(b"not onnx")
    assert cached_onnx(str(model))[0] == second and recorded_digest(second) == new_digest


def test_a_model_elsewhere_than_a_local_writable_folder_is_cached_in_the_user_cache(
    quiet_cache: Path,
) -> None:
    digest = "ab" * 32
    assert onnx_cache_path("az://models/run/model.pt", digest) == quiet_cache / f"{digest}.onnx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "access", lambda *a, **k: False)  # a read-only folder (root writes all)
        assert onnx_cache_path("/models/run/model.pt", digest) == quiet_cache / f"{digest}.onnx"


# -- auto ---------------------------------------------------------------------------------------


def test_auto_runs_torch_for_a_small_prediction_and_onnxruntime_for_a_large_one(
    scene: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "small.tif"
    predict_region(config_for(model_dir / "model.pt", scene, small))
    assert read(small)[1]["LANDCOVER_BACKEND"] == "torch"
    monkeypatch.setattr(runtime, "auto_onnx_min_window_pixels", lambda: 1)
    large = tmp_path / "large.tif"
    predict_region(config_for(model_dir / "model.pt", scene, large))
    assert read(large)[1]["LANDCOVER_BACKEND"] == "onnxruntime"


def test_auto_runs_torch_where_onnxruntime_is_missing_or_the_export_fails(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = str(model_dir / "model.pt")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    model, _ = load_window_model(url, device=CPU)
    assert for_prediction(model, 10**12).inference.backend == "torch"
    monkeypatch.undo()

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise ExportError(f"{url}: the ONNX exporter failed on small_unet (boom)")

    monkeypatch.setattr(runtime, "cached_onnx", fail)
    model, _ = load_window_model(url, device=CPU)
    with caplog.at_level(logging.WARNING, logger="landcover.prediction.runtime"):
        assert for_prediction(model, 10**12).inference.backend == "torch"
    assert "the ONNX exporter failed on small_unet (boom); running the model with torch" in (
        caplog.text
    )
    with pytest.raises(PredictionError) as caught:
        load_window_model(url, backend="onnxruntime", device=CPU)
    assert str(caught.value) == (
        f"--backend onnxruntime: {url}: the ONNX exporter failed on small_unet (boom); or use "
        "--backend torch"
    )


# -- one line for what cannot run ---------------------------------------------------------------


def test_onnxruntime_missing_is_one_line_saying_what_to_install(
    scene: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    out = tmp_path / "lc.tif"
    args = ["predict", str(model_dir / "model.pt"), str(scene), "--out", str(out),
            "--backend", "onnxruntime", "--device", "cpu", "--no-quicklook"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: --backend onnxruntime: onnxruntime is not installed; pip install onnx "
        "onnxruntime onnxscript (dependencies of landcover); or use --backend torch\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("device", ["cpu"])
def test_bf16_on_a_cpu_without_it_is_one_line(
    device: str, scene: Path, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "cpu_features", lambda: CpuFeatures(frozenset({"avx2"})))
    args = ["predict", str(model_dir / "model.pt"), str(scene), "--out", str(tmp_path / "o.tif"),
            "--precision", "bf16", "--device", device, "--no-quicklook"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: --precision bf16: this CPU has no native bf16 (AVX-512 BF16 or AMX; it has "
        "avx2), where bf16 is slower than fp32; use --precision fp32\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_bf16_with_onnxruntime_is_one_line(model_dir: Path) -> None:
    with pytest.raises(PredictionError) as caught:
        load_window_model(
            str(model_dir / "model.pt"), backend="onnxruntime", precision="bf16", device=CPU
        )
    assert str(caught.value).startswith("--precision bf16 runs with --backend torch;")


def test_the_cpu_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n\nprocessor\t: 1\n"
    assert parse_cpu_flags(text) >= {"avx512_bf16", "avx2"}
    (tmp_path / "cpuinfo").write_text(text)
    features = cpu.cpu_features(tmp_path / "cpuinfo")
    assert features.bf16 and not features.amx
    assert features.describe() == "avx2, avx512f, avx512_bf16, avx512_vnni"
    assert not cpu.cpu_features(tmp_path / "missing").bf16
    assert CpuFeatures(frozenset({"amx_tile", "amx_bf16"})).bf16


def test_the_old_runtime_flag_still_works_and_warns_once(
    scene: Path, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    args = ["predict", str(model_dir / "model.pt"), str(scene), "--out", str(out),
            "--runtime", "onnxruntime", "--device", "cpu", "--no-quicklook"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.output.count("warning: --runtime is deprecated: use --backend") == 1
    assert read(out)[1]["LANDCOVER_BACKEND"] == "onnxruntime"


# -- exactness: any rank count, tiles, thread count, batch -----------------------------------------


def test_onnxruntime_gives_the_same_logits_at_any_thread_count_and_batch(
    model_dir: Path,
) -> None:
    """Why onnxruntime's batches need no padding (runtime.CPU_MIN_BATCH is torch's): its CPU
    kernels give a window the same bits whatever the threads and the batch around it."""
    model, _ = load_window_model(str(model_dir / "model.pt"), backend="onnxruntime", device=CPU)
    batch = torch.randn(17, 4, CHIP + 13, CHIP, generator=torch.Generator().manual_seed(0))
    before = torch.get_num_threads()
    logits = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            logits[threads] = model(batch)
            for size in (1, 2, 3, 5):
                assert torch.equal(model(batch[:size]), logits[threads][:size]), (threads, size)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(logits[1], logits[2]) and torch.equal(logits[3], logits[2])


# torch on the CPU runs the model's chip only: windows twice its edge are onnxruntime's
# (torch fp32 on its chip stays in `make test-fast`; the others start ranks after an export or
# under bf16 autocast, and are marked slow)
WINDOW_RUNS = [
    pytest.param(b, p, "chip", marks=() if (b, p) == ("torch", "fp32") else pytest.mark.slow)
    for b, p in RUNS
] + [pytest.param("onnxruntime", "fp32", "64", marks=pytest.mark.slow)]


@pytest.mark.parametrize(("backend", "precision", "window"), WINDOW_RUNS)
def test_ranks_and_tiles_write_the_one_process_map_for_every_backend(
    backend: str, precision: str, window: str, scene: Path, model_dir: Path, tmp_path: Path
) -> None:
    """One process on 2 threads, 2 ranks in rank mode on 1 thread each, and a tiled product
    (other blocks and batches): the same bytes, per backend and precision, with the model's
    chip and with windows of twice its edge (--window 64, onnxruntime only: torch on the CPU
    refuses windows larger than the chip, test_windows.py)."""
    common = ["--backend", backend, "--precision", precision, "--device", "cpu",
              "--no-quicklook", "--batch-size", "3", "--window", window]  # fmt: skip
    args = ["predict", str(model_dir / "model.pt"), str(scene), "--block-px", "16", *common]
    runs = predict_at_rank_counts(args, tmp_path)
    assert runs[2].read_bytes() == runs[1].read_bytes()
    one, tags = read(runs[1])
    assert tags["LANDCOVER_BACKEND"] == backend
    assert len(np.unique(one)) >= 2  # class boundaries, where kernels could differ
    tiles = config_for(
        model_dir / "model.pt", scene, f"{tmp_path / 'tiles'}/", block_px=40, batch_size=5,
        backend=backend, precision=precision, window=window,
    )  # fmt: skip
    predict_product(TiledSetup(tiles, 64))
    mosaic, mosaic_tags = read(tmp_path / "tiles" / "mosaic.vrt")
    np.testing.assert_array_equal(mosaic, one)
    assert mosaic_tags["LANDCOVER_BACKEND"] == backend


@pytest.mark.slow  # an export and two rank processes
def test_nproc_ranks_export_once_and_write_the_one_process_map(
    scene: Path, model_dir: Path, tmp_path: Path
) -> None:
    """--nproc 2 with onnxruntime and no export yet: the ranks (processes) find one export,
    and the map is the one process's bytes."""
    model = Path(shutil.copy(model_dir / "model.pt", tmp_path / "fresh.pt"))
    with torch.no_grad():  # another digest than the module's model: nothing cached yet
        module, meta = load_model_file(model)
        module.head.bias.add_(0.5)  # type: ignore[operator, union-attr]
    save_model_file(model, module, meta)
    outs = {n: tmp_path / f"n{n}" / "lc.tif" for n in (2, 1)}
    for nproc, out in outs.items():
        out.parent.mkdir()
        args = ["predict", str(model), str(scene), "--out", str(out), "--backend",
                "onnxruntime", "--device", "cpu", "--block-px", "16", "--no-quicklook",
                *(["--nproc", str(nproc)] if nproc > 1 else [])]  # fmt: skip
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    assert outs[2].read_bytes() == outs[1].read_bytes()
    exports = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".onnx")
    assert exports == [f"fresh.{model_digest(str(model))[:16]}.onnx"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


# -- agreement of a trained model across backends ----------------------------------------------


@pytest.mark.slow  # a trained model's export, three predictions of a whole scene
def test_the_backends_maps_of_a_trained_model_agree(
    trained: Path, tiny_scenes: SynthResult, tmp_path: Path
) -> None:
    """A trained model's classes on a whole 448 px scene: onnxruntime agrees with torch fp32 on
    at least 99.99 % of the pixels. bf16 (opt-in, where the CPU has it) keeps 8 bits of
    mantissa, so pixels near a tie flip: it must agree on most pixels, but need not reach
    the 99.9 % that `--precision auto` would ask of it (auto stays fp32). Every backend runs
    the chip: `--window auto` gives onnxruntime larger windows than torch on the CPU, whose
    maps then differ near window edges as any two window layouts do."""
    scene = Path(tiny_scenes.image_paths[0])
    maps = {}
    for backend, precision in RUNS:
        out = tmp_path / f"{backend}-{precision}.tif"
        options = dict(backend=backend, precision=precision, block_px=256, window="chip")
        predict_region(config_for(trained, scene, out, **options))
        maps[backend, precision] = read(out)[0][0]
    reference = maps["torch", "fp32"]
    counts = np.bincount(reference.ravel(), minlength=5)
    assert (counts[1:] > 0.02 * counts.sum()).sum() >= 2, counts  # boundaries to agree on
    assert float((maps["onnxruntime", "fp32"] == reference).mean()) >= 0.9999
    if HAS_BF16:
        assert float((maps["torch", "bf16"] == reference).mean()) >= 0.99


def test_auto_reads_only_the_metadata_until_it_has_sized_the_prediction(
    model_dir: Path, tmp_path: Path
) -> None:
    """Under `auto` a model file's torch model is built only where torch runs it, and then by
    `for_prediction`, before any window: onnxruntime's predictions never hold both models."""
    url = str(model_dir / "model.pt")
    model, meta = load_window_model(url, device=CPU)
    assert isinstance(model, runtime.TorchWindowModel) and not model.loaded
    assert meta == load_model_file(url)[1]
    assert for_prediction(model, AUTO_ONNX_MIN_WINDOW_PIXELS).inference.backend == "onnxruntime"
    assert not model.loaded
    assert for_prediction(model, 1) is model and model.loaded
    # a model file whose weights do not fit its architecture fails in setup, not in the loop
    payload = torch.load(url, weights_only=True)
    payload["state_dict"] = {"bogus": torch.zeros(1)}
    torch.save(payload, tmp_path / "model.pt")
    model, _ = load_window_model(str(tmp_path / "model.pt"), device=CPU)
    with pytest.raises(ModelFileError, match="weights do not fit small_unet"):
        for_prediction(model, 1)


def test_a_cached_export_runs_without_importing_the_exporter(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxscript (and the sympy it imports) is for exporting: a prediction whose export is
    cached, in every rank and task, only checks that it is installed."""
    url = str(model_dir / "model.pt")
    cached_onnx(url)
    monkeypatch.delitem(sys.modules, "onnxscript", raising=False)
    model, _ = load_window_model(url, device=CPU)
    assert for_prediction(model, 10**12).inference.backend == "onnxruntime"
    model, _ = load_window_model(url, backend="onnxruntime", device=CPU)
    assert "onnxscript" not in sys.modules


def test_window_pixels_decide_auto_alike_on_every_rank(model_dir: Path) -> None:
    model, _ = load_window_model(str(model_dir / "model.pt"), device=CPU)
    limit = AUTO_ONNX_MIN_WINDOW_PIXELS
    assert for_prediction(model, limit - 1) is model
    assert for_prediction(model, limit).inference.backend == "onnxruntime"
    assert dataclasses.asdict(for_prediction(model, limit - 1).inference) == {
        "backend": "torch",
        "precision": "fp32",
        "provider": "cpu",
    }
