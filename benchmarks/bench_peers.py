"""Side by side with the peers: chips, prediction and memory against TorchGeo, geoai and Raster
Vision, on the same scene with the same weights.

1. Chips: chips/s writing 256 px image + label chips of one NAIP-sized scene: ours (`landcover
   tile` into a Zarr store) against geoai's `export_geotiff_tiles` (GeoTIFF per chip) and Raster
   Vision's `SemanticSegmentationSlidingWindowGeoDataset`, each chip saved as it returns it
   (float32 images, integer labels, one .npy each; its `chip` command's zip of uint8 .npy and .png
   through its sample writer is not what this measures), each at stride 256.
2. Prediction: km²/min, peak RSS and seam agreement for a `small_unet` trained here briefly and
   an smp U-Net (`unet_resnet18`, a fixed random init), each tool at its default overlap and
   blending: ours (`landcover predict`), geoai's `predict_geotiff`, Raster Vision's
   `predict_scene_ss` (what its predict command runs) at its default stride, and TorchGeo's
   `GridGeoSampler` loop (each window's argmax written where it lies, nothing blended). Seam
   agreement: the share of the pixels within 16 px of an interior edge of that tool's windows
   whose class equals whole-image inference (the model run once on the whole scene).
3. Scaling with area: peak RSS of each tool at 1x and 4x the area.

Each tool runs in a subprocess of its own (`--child`); peak RSS is the child's own high-water
mark (VmHWM: ru_maxrss of a child also counts the parent's RSS at the fork), seconds are the
tool's call alone (imports, model load and scene files are made before). Every peer gets
the same weights as a plain `torch.nn.Module` that takes pixels the way that peer hands them
over (0-255 floats, or 0-1 after its /255), normalises them with the model file's band
statistics (`landcover.data.normalise`) and never picks class 0 (nodata: ours never does).

Needs the peers: `make bench-peers` builds .venv-peers (pyproject's `peers` extra) and runs this.
A peer that is not installed, or that fails a case, gets a row saying so with its error.

Usage: python benchmarks/bench_peers.py [--quick] [--json PATH] [--only SECTION ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from bench_predict import _save, _train
from machine import load_average
from resultfile import ResultFile, ResultTable, this_machine, today, write_result_file

from landcover.models.registry import build_model
from landcover.prediction.blend import window_starts
from tiling.sources.classes import get_class_map
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes

CHIP = 256
OVERLAP = CHIP // 4  # predict's default
EDGE_PX = 16
CLASS_MAP = get_class_map("chesapeake7to5")
SECTIONS = ["chips", "predict", "scaling"]
TOOLS = ["ours", "geoai", "rastervision", "torchgeo"]
CHIP_TOOLS = ["ours", "geoai", "rastervision"]
PEER_DISTRIBUTIONS = {
    "torchgeo": "torchgeo",
    "geoai": "geoai-py",
    "rastervision": "rastervision_pytorch_learner",
}
MODELS = ("small_unet", "unet_resnet18")
RESULTS = Path(__file__).resolve().parent / "results" / "peers.json"
MIB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small scenes, a few minutes")
    parser.add_argument("--json", default=None, help=f"write the tables here (e.g. {RESULTS})")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=SECTIONS)
    parser.add_argument(
        "--chip-scene-px", type=int, default=None, help="side of the chips scene [6720: NAIP]"
    )
    parser.add_argument(
        "--predict-px", type=int, default=None, help="side of the 1x prediction scene [1024]"
    )
    parser.add_argument("--train-seconds", type=float, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(json.loads(args.child))
        return
    quick = args.quick
    chip_side = args.chip_scene_px or (1792 if quick else 6720)
    predict_side = args.predict_px or (512 if quick else 1024)
    train_s = args.train_seconds if args.train_seconds is not None else (15.0 if quick else 90.0)
    versions = peer_versions()
    machine = _machine()
    print(f"# bench_peers ({'quick' if quick else 'full'}) — {machine}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    tables: list[ResultTable] = []
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        work = Path(tmp)
        if "chips" in args.only:
            tables.append(chips(work, side_px=chip_side))
        if {"predict", "scaling"} & set(args.only):
            models = prepare_models(work, train_s=train_s)
            runs = PredictionRuns(work)
            if "predict" in args.only:
                tables.append(prediction(runs, models, side_px=predict_side))
            if "scaling" in args.only:
                tables.append(scaling(runs, models["small_unet"], side_px=predict_side))
    if args.json:
        command = "python benchmarks/bench_peers.py " + " ".join(sys.argv[1:])
        write_result_file(
            args.json,
            ResultFile(
                benchmark="bench_peers",
                command=command.strip(),
                machine=machine,
                date=today(),
                tables=tables,
                conditions=f"load average {load_average():.1f} at the end; versions: "
                + ", ".join(f"{k} {v}" for k, v in versions.items()),
                extra={"versions": versions},
            ),
        )
        print(f"\nwrote {args.json}")


def peer_versions() -> dict[str, str]:
    """Versions of landcover, torch and each peer ('not installed' where one is missing)."""
    out = {"landcover": _version("landcover"), "torch": torch.__version__}
    for name, dist in PEER_DISTRIBUTIONS.items():
        out[name] = _version(dist)
    return out


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# -- runs in subprocesses -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """What one child reported: the tool call's seconds and output, and the child's peak RSS."""

    ok: bool
    seconds: float = math.nan
    peak_rss_bytes: float = math.nan
    before_rss_bytes: float = math.nan
    chips: int = 0
    windows: tuple[tuple[int, int, int, int], ...] = ()  # (row, col, height, width)
    error: str = ""


def run_child(spec: dict[str, Any], *, timeout_s: float = 3600.0) -> Run:
    """Run one case in a fresh interpreter; a failure or a timeout is a Run with its error."""
    try:
        child = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return Run(ok=False, error=f"no result within {timeout_s:.0f} s")
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = [line for line in child.stderr.splitlines() if line.strip()]
        return Run(ok=False, error=_one_line(tail[-1] if tail else f"exit {child.returncode}"))
    record = json.loads(lines[-1])
    if not record.get("ok", False):
        return Run(ok=False, error=_one_line(record.get("error", "failed")))
    return Run(
        ok=True,
        seconds=float(record["seconds"]),
        peak_rss_bytes=float(record["peak_rss_bytes"]),
        before_rss_bytes=float(record["before_rss_bytes"]),
        chips=int(record.get("chips", 0)),
        windows=tuple(tuple(w) for w in record.get("windows", ())),  # type: ignore[misc]
    )


def peak_rss_bytes() -> float:
    """This process's peak RSS since it started (VmHWM). Not ru_maxrss: after fork and exec
    that still counts the parent's RSS at the fork."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return float(line.split()[1]) * 1024.0  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _child(spec: dict[str, Any]) -> None:
    """One case: import the tool, prepare, then time its call alone; print one JSON line."""
    try:
        case = _CASES[(spec["section"], spec["tool"])]
        call = case(spec)  # imports and model load happen here, outside the timing
        before = peak_rss_bytes()
        started = time.perf_counter()
        extra = call()
        seconds = time.perf_counter() - started
        record = {
            "seconds": seconds,
            "before_rss_bytes": before,
            "peak_rss_bytes": peak_rss_bytes(),
        }
        print(json.dumps({"ok": True, **record, **extra}))
    except Exception as exc:  # a peer's failure is a row of the table, not a crash
        traceback.print_exc(file=sys.stderr)
        message = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": message}))


# -- the same weights for every tool ------------------------------------------------------------


class SameWeights(torch.nn.Module):
    """A landcover model file as a plain module for a peer: pixels in the peer's scale (`scale`
    back to 0-255), normalised with the file's band statistics, and class 0 (nodata, which our
    predict never outputs) pushed far below the others so that any argmax skips it."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model_path: str, *, scale: float) -> None:
        super().__init__()
        from landcover.models.modelfile import load_model_file

        self.model, meta = load_model_file(model_path)
        self.scale = scale
        self.register_buffer("mean", torch.tensor(meta.band_mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(meta.band_std).view(1, -1, 1, 1))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        from landcover.data.normalise import normalise

        x = normalise(pixels.float() * self.scale, self.mean, self.std)
        logits: torch.Tensor = self.model(x)
        logits[:, 0] = -1e4
        return logits


def whole_image_classes(model_path: str, image: str) -> npt.NDArray[np.uint8]:
    """The reference: the model run once on the whole scene, argmax over classes 1..n."""
    with rasterio.open(image) as src:
        pixels = torch.from_numpy(src.read())[None]
    model = SameWeights(model_path, scale=1.0).eval()
    with torch.inference_mode():
        logits = model(pixels)
    classes: npt.NDArray[np.uint8] = logits[0].argmax(0).numpy().astype(np.uint8)
    return classes


# -- cases: each returns the call to time --------------------------------------------------------


def _chips_ours(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from landcover.cli.app import main as cli

    args = ["tile", spec["image"], "--labels", spec["labels"], "--out", spec["out"]]
    args += ["--chip-size", str(CHIP), "--min-valid", "0", "--val-fraction", "0", "--overwrite"]

    def call() -> dict[str, Any]:
        cli.main(args, standalone_mode=False)
        import zarr

        images = zarr.open_group(spec["out"], mode="r")["images"]
        assert isinstance(images, zarr.Array)  # the store's contract: images is an array
        return {"chips": int(images.shape[0])}

    return call


def _chips_geoai(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from geoai.utils.training import export_geotiff_tiles  # type: ignore[import-not-found]

    def call() -> dict[str, Any]:
        export_geotiff_tiles(
            spec["image"],
            spec["out"],
            in_class_data=spec["labels"],
            tile_size=CHIP,
            stride=CHIP,
            quiet=True,
        )
        return {"chips": len(list(Path(spec["out"], "images").glob("*.tif")))}

    return call


def _chips_rastervision(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from rastervision.pytorch_learner import (  # type: ignore[import-not-found]
        SemanticSegmentationSlidingWindowGeoDataset,
    )

    class_config = _rv_class_config()
    out = Path(spec["out"])

    def call() -> dict[str, Any]:
        dataset = SemanticSegmentationSlidingWindowGeoDataset.from_uris(
            class_config=class_config,
            image_uri=spec["image"],
            label_raster_uri=spec["labels"],
            size=CHIP,
            stride=CHIP,
            padding=0,
        )
        (out / "img").mkdir(parents=True)
        (out / "labels").mkdir()
        for k in range(len(dataset)):
            image, label = dataset[k]
            np.save(out / "img" / f"{k}.npy", image.numpy())
            np.save(out / "labels" / f"{k}.npy", label.numpy())
        return {"chips": len(dataset)}

    return call


def _rv_class_config() -> Any:
    """Raster Vision's class table for ours: class 0 is nodata, its `null_class`."""
    from rastervision.core.data import ClassConfig  # type: ignore[import-not-found]

    names = [f"class{n}" for n in range(CLASS_MAP.num_classes)]
    return ClassConfig(names=names, null_class=names[0])


def _predict_ours(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from landcover.cli.app import main as cli

    args = ["predict", spec["model"], spec["image"], "--out", spec["out"], "--device", "cpu"]

    def call() -> dict[str, Any]:
        cli.main([*args, "--overwrite"], standalone_mode=False)
        with rasterio.open(spec["image"]) as src:
            height, width = src.height, src.width
        rows = window_starts(height, CHIP, OVERLAP)
        cols = window_starts(width, CHIP, OVERLAP)
        return {"windows": [(r, c, CHIP, CHIP) for r in rows for c in cols]}

    return call


def _predict_geoai(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from geoai.inference import predict_geotiff  # type: ignore[import-not-found]

    model = SameWeights(spec["model"], scale=255.0)  # its default preprocessing divides by 255

    def call() -> dict[str, Any]:
        predict_geotiff(
            model,
            spec["image"],
            spec["out"],
            num_classes=CLASS_MAP.num_classes,
            output_dtype="uint8",
            output_nodata=255,
            device="cpu",
            verbose=False,
            postprocess_fn=lambda logits: logits.argmax(axis=0).astype(np.uint8),
        )
        return {"windows": _geoai_windows(spec["image"])}

    return call


def _geoai_windows(image: str) -> list[tuple[int, int, int, int]]:
    """predict_geotiff's tiles at its defaults (tile 256, overlap 64): starts every stride,
    the last pulled back flush with the edge."""
    with rasterio.open(image) as src:
        height, width = src.height, src.width
    stride = CHIP - OVERLAP
    tiles: dict[tuple[int, int, int, int], None] = {}  # ordered and without repeats
    for row in range(0, height, stride):
        for col in range(0, width, stride):
            r1, c1 = min(row + CHIP, height), min(col + CHIP, width)
            r0, c0 = max(0, r1 - CHIP), max(0, c1 - CHIP)
            tiles[(r0, c0, r1 - r0, c1 - c0)] = None
    return list(tiles)


def _predict_rastervision(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from rastervision.core.data import (  # type: ignore[import-not-found]
        RasterioSource,
        Scene,
        SemanticSegmentationLabelStore,
    )
    from rastervision.core.rv_pipeline import SemanticSegmentationPredictOptions  # type: ignore[import-not-found]
    from rastervision.pytorch_learner import (  # type: ignore[import-not-found]
        SemanticSegmentationGeoDataConfig,
        SemanticSegmentationLearner,
        SemanticSegmentationLearnerConfig,
        SemanticSegmentationSlidingWindowGeoDataset,
        SolverConfig,
    )
    from rastervision.pytorch_learner.utils import predict_scene_ss  # type: ignore[import-not-found]

    class_config = _rv_class_config()
    model = SameWeights(spec["model"], scale=255.0)  # its datasets divide uint8 by 255
    config = SemanticSegmentationLearnerConfig(
        data=SemanticSegmentationGeoDataConfig(class_config=class_config, num_workers=0),
        solver=SolverConfig(),
    )
    learner = SemanticSegmentationLearner(
        cfg=config, output_dir=spec["work"], model=model, training=False
    )
    options = SemanticSegmentationPredictOptions(chip_sz=CHIP)  # stride: chip_sz by default

    def call() -> dict[str, Any]:
        source = RasterioSource(spec["image"])
        store = SemanticSegmentationLabelStore(
            spec["out_dir"], crs_transformer=source.crs_transformer, class_config=class_config
        )
        scene = Scene(id="scene", raster_source=source, label_store=store)
        labels = predict_scene_ss(learner, scene, options)
        store.save(labels)
        # the windows predict_scene_ss ran (its dataset at the default stride)
        ran = SemanticSegmentationSlidingWindowGeoDataset(scene, size=CHIP, stride=CHIP).windows
        return {"windows": [(w.ymin, w.xmin, w.height, w.width) for w in ran]}

    return call


def _predict_torchgeo(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    from rasterio.windows import from_bounds
    from torch.utils.data import DataLoader
    from torchgeo.datasets import RasterDataset, stack_samples  # type: ignore[import-not-found]
    from torchgeo.samplers import GridGeoSampler  # type: ignore[import-not-found]

    model = SameWeights(spec["model"], scale=1.0).eval()  # RasterDataset gives raw values

    class Scene(RasterDataset):  # type: ignore[misc]
        filename_glob = Path(spec["image"]).name
        is_image = True

    def call() -> dict[str, Any]:
        dataset = Scene(paths=str(Path(spec["image"]).parent))
        sampler = GridGeoSampler(dataset, size=CHIP)  # stride defaults to size
        loader: DataLoader[dict[str, Any]] = DataLoader(
            dataset, sampler=sampler, batch_size=16, collate_fn=stack_samples
        )
        with rasterio.open(spec["image"]) as src:
            profile = {**src.profile, "count": 1, "dtype": "uint8", "nodata": 0}
            height, width, transform = src.height, src.width, src.transform
        windows = []
        with rasterio.open(spec["out"], "w", **profile) as dst, torch.inference_mode():
            for batch in loader:
                classes = model(batch["image"]).argmax(1).numpy().astype(np.uint8)
                for k, (x, y, _) in enumerate(batch["bounds"]):
                    window = from_bounds(x.start, y.start, x.stop, y.stop, transform)
                    r, c = round(window.row_off), round(window.col_off)
                    h, w = min(CHIP, height - r), min(CHIP, width - c)
                    dst.write(classes[k, :h, :w], 1, window=((r, r + h), (c, c + w)))
                    windows.append((r, c, CHIP, CHIP))
        return {"windows": windows}

    return call


_CASES: dict[tuple[str, str], Callable[[dict[str, Any]], Callable[[], dict[str, Any]]]] = {
    ("chips", "ours"): _chips_ours,
    ("chips", "geoai"): _chips_geoai,
    ("chips", "rastervision"): _chips_rastervision,
    ("predict", "ours"): _predict_ours,
    ("predict", "geoai"): _predict_geoai,
    ("predict", "rastervision"): _predict_rastervision,
    ("predict", "torchgeo"): _predict_torchgeo,
}


# -- 1. chips -----------------------------------------------------------------------------------


def chips(work: Path, *, side_px: int) -> ResultTable:
    """Chips/s of each tool writing 256 px image + label chips of one scene, stride 256."""
    scene = synthesize_scenes(SynthConfig(work / "chips", scenes=1, size_px=side_px, seed=3))
    image, labels = str(scene.image_paths[0]), str(scene.label_paths[0])
    rows: list[list[Any]] = []
    ours_rate = math.nan
    for tool in CHIP_TOOLS:
        out = work / f"chips-{tool}" / ("chips.zarr" if tool == "ours" else "")
        spec = {"section": "chips", "tool": tool, "image": image, "labels": labels, "out": str(out)}
        run = run_child(spec)
        if not run.ok:
            rows.append([tool, _peer_version(tool), None, None, None, None, run.error])
            continue
        rate = run.chips / run.seconds
        if tool == "ours":
            ours_rate = rate
        rows.append(
            [
                tool,
                _peer_version(tool),
                run.chips,
                round(rate, 1),
                round(ours_rate / rate, 2),
                round(run.peak_rss_bytes / MIB),
                "",
            ]
        )
    table = ResultTable(
        name="chips",
        title=f"Chips: 256 px image + label chips of one {side_px} x {side_px} px 4-band scene",
        columns=["tool", "version", "chips", "chips/s", "ours / tool", "peak RSS MiB", "error"],
        rows=rows,
        note="stride 256; seconds of the tool's call alone, in a fresh process each",
    )
    _print_table(table)
    return table


# -- 2. prediction ------------------------------------------------------------------------------


def prepare_models(work: Path, *, train_s: float) -> dict[str, str]:
    """Model files: small_unet trained `train_s` seconds on synthetic scenes, and the smp
    U-Net at a fixed random init."""
    from bench_predict import _read

    synth = synthesize_scenes(SynthConfig(work / "train", scenes=2, size_px=512, seed=5))
    images = [_read(p) for p in synth.image_paths]
    labels = [CLASS_MAP.apply(_read(p)[0], nodata=15) for p in synth.label_paths]
    stack = np.stack(images).astype(np.float64)
    mean = tuple(float(v) for v in stack.mean(axis=(0, 2, 3)))
    std = tuple(float(v) for v in stack.std(axis=(0, 2, 3)))
    trained, steps, loss = _train(images, labels, mean, std, train_s)
    print(f"(small_unet trained {train_s:.0f} s: {steps} steps, final loss {loss:.3f})")
    paths = {name: str(work / f"{name}.pt") for name in MODELS}
    _save(Path(paths["small_unet"]), trained, "small_unet", mean, std)
    torch.manual_seed(0)
    smp_unet = build_model("unet_resnet18", num_classes=CLASS_MAP.num_classes)
    _save(Path(paths["unet_resnet18"]), smp_unet, "unet_resnet18", mean, std)
    return paths


def _predict_scene(work: Path, side_px: int) -> str:
    folder = work / f"scene-{side_px}"
    if not folder.exists():
        synthesize_scenes(SynthConfig(folder, scenes=1, size_px=side_px, seed=11))
    return str(next((folder / "naip").glob("*.tif")))


class PredictionRuns:
    """Prediction runs by (tool, model, scene), each run once: the scaling table's 1x runs are
    the prediction table's small_unet runs."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.done: dict[tuple[str, str, str], tuple[Run, str]] = {}

    def get(self, tool: str, model: str, image: str) -> tuple[Run, str]:
        """The run of `tool` with `model` on `image` and the class raster it wrote."""
        key = (tool, model, image)
        if key not in self.done:
            out_dir = self.work / f"pred-{len(self.done)}-{tool}"
            out_dir.mkdir(parents=True)
            out = out_dir / "classes.tif"
            spec = {
                "section": "predict",
                "tool": tool,
                "model": model,
                "image": image,
                "out": str(out),
                "out_dir": str(out_dir / "rv"),
                "work": str(out_dir),
            }
            run = run_child(spec)
            if tool == "rastervision":
                out = out_dir / "rv" / "labels.tif"
            self.done[key] = (run, str(out))
        return self.done[key]


def prediction(runs: PredictionRuns, models: dict[str, str], *, side_px: int) -> ResultTable:
    """km²/min, peak RSS and seam agreement of each tool on one scene, for each model."""
    image = _predict_scene(runs.work, side_px)
    km2 = side_px * side_px / 1e6
    rows: list[list[Any]] = []
    for name, model in models.items():
        reference = whole_image_classes(model, image)
        ours_rate = math.nan
        for tool in TOOLS:
            run, out = runs.get(tool, model, image)
            if not run.ok:
                rows.append([name, tool, None, None, None, None, None, None, run.error])
                continue
            classes = _read_classes(out)
            near = near_window_edges(classes.shape, run.windows)
            rate = km2 / run.seconds * 60
            if tool == "ours":
                ours_rate = rate
            rows.append(
                [
                    name,
                    tool,
                    len(run.windows),
                    round(rate, 3),
                    round(ours_rate / rate, 2),
                    round(run.peak_rss_bytes / MIB),
                    _share(classes == reference, near),
                    _share(classes == reference, np.ones_like(near)),
                    "",
                ]
            )
        majority = np.bincount(reference.ravel()).max() / reference.size
        print(f"({name}: whole-image inference's most common class covers {majority:.1%})")
    table = ResultTable(
        name="predict",
        title=(
            f"Prediction: one {side_px} x {side_px} px scene ({km2:.2f} km² at 1 m), CPU, "
            "each tool at its default overlap and blending"
        ),
        columns=[
            "model",
            "tool",
            "windows",
            "km²/min",
            "ours / tool",
            "peak RSS MiB",
            f"agreement within {EDGE_PX} px of window edges",
            "agreement, all pixels",
            "error",
        ],
        rows=rows,
        note=(
            "agreement: share of pixels whose class equals whole-image inference (one forward "
            "pass over the scene) with the same weights"
        ),
    )
    _print_table(table)
    return table


def near_window_edges(
    shape: tuple[int, ...], windows: Sequence[tuple[int, int, int, int]]
) -> npt.NDArray[np.bool_]:
    """Pixels within EDGE_PX of an edge of any window that is not the scene's own border."""
    height, width = shape[-2:]
    near = np.zeros((height, width), dtype=bool)
    for r, c, h, w in windows:
        r1, c1 = min(r + h, height), min(c + w, width)
        for edge in (r, r + h):
            if 0 < edge < height:
                near[max(0, edge - EDGE_PX) : edge + EDGE_PX, c:c1] = True
        for edge in (c, c + w):
            if 0 < edge < width:
                near[r:r1, max(0, edge - EDGE_PX) : edge + EDGE_PX] = True
    return near


def _share(hit: npt.NDArray[np.bool_], where: npt.NDArray[np.bool_]) -> float | None:
    return round(float(hit[where].mean()), 4) if where.any() else None


def _read_classes(path: str) -> npt.NDArray[np.uint8]:
    with rasterio.open(path) as src:
        out: npt.NDArray[np.uint8] = src.read(1)
        return out


# -- 3. scaling with area -----------------------------------------------------------------------


def scaling(runs: PredictionRuns, model: str, *, side_px: int) -> ResultTable:
    """Peak RSS of each tool predicting with `model` at 1x and 4x the area."""
    rows: list[list[Any]] = []
    for tool in TOOLS:
        done: list[Run] = []
        for side in (side_px, 2 * side_px):  # area x1, x4
            run, _ = runs.get(tool, model, _predict_scene(runs.work, side))
            if not run.ok:
                rows.append([tool, None, None, None, None, None, run.error])
                break
            done.append(run)
        else:
            peak = [r.peak_rss_bytes / MIB for r in done]
            growth = [(r.peak_rss_bytes - r.before_rss_bytes) / MIB for r in done]
            rows.append(
                [
                    tool,
                    round(peak[0]),
                    round(peak[1]),
                    round(peak[1] / peak[0], 2),
                    round(growth[0]),
                    round(growth[1]),
                    "",
                ]
            )
    table = ResultTable(
        name="scaling",
        title=(
            f"Peak RSS as the area grows: small_unet, {side_px} px and {2 * side_px} px "
            "square scenes (1x and 4x the area)"
        ),
        columns=[
            "tool",
            "1x peak MiB",
            "4x peak MiB",
            "4x / 1x",
            "1x growth in the call MiB",
            "4x growth in the call MiB",
            "error",
        ],
        rows=rows,
        note=(
            "peak: the process's high-water RSS (imports and model included); growth: the "
            "peak minus the high-water mark before the tool's call"
        ),
    )
    _print_table(table)
    return table


# -- helpers ------------------------------------------------------------------------------------


def _peer_version(tool: str) -> str:
    return _version("landcover" if tool == "ours" else PEER_DISTRIBUTIONS[tool])


def _print_table(table: ResultTable) -> None:
    from resultfile import table_markdown

    print()
    print(f"## {table.title}")
    print()
    print(table_markdown(table))
    if table.note:
        print()
        print(table.note)
    sys.stdout.flush()


def _machine() -> str:
    return (
        f"{this_machine()}, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f}"
        f" GiB, CPU only, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"load average {load_average():.1f} at start"
    )


if __name__ == "__main__":
    main()
