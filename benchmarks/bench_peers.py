"""Side by side with the peers: chips, prediction and memory against TorchGeo, geoai and Raster
Vision, on the same scene with the same weights.

1. Chips: chips/s writing 256 px image + label chips of one NAIP-sized scene: ours (`landcover
   tile` into a Zarr store) against geoai's `export_geotiff_tiles` (GeoTIFF per chip) and Raster
   Vision's `SemanticSegmentationSlidingWindowGeoDataset`, each chip saved as it returns it
   (float32 images, integer labels, one .npy each; its `chip` command's zip of uint8 .npy and .png
   through its sample writer is not what this measures), each at stride 256.
2. Prediction: km²/min, peak RSS and seam agreement on one scene (4,096 px a side by default: a
   NAIP quarter-quad is about 6,000 x 7,500) for two models, both trained here briefly on a chip
   store that `landcover tile` writes from synthetic scenes: `small_unet` and an smp U-Net
   (`unet_resnet18`). Rows: ours at its defaults (`landcover predict MODEL IMAGE --out ...`, no
   option), then one row per backend and precision that `landcover predict` offers here (torch
   fp32; onnxruntime fp32; torch bf16 where the CPU has AVX-512 BF16 or AMX; onnxruntime int8
   where `--precision int8` exists, calibrated on the training store), each with `--window chip`
   and `--window auto`; then each peer at its defaults: geoai's `predict_geotiff`, Raster Vision's
   `predict_scene_ss` (what its predict command runs) at its default stride, and TorchGeo's
   `GridGeoSampler` loop (each window's argmax written where it lies, nothing blended). Seam
   agreement: the share of the pixels within 16 px of an interior edge of that tool's windows
   whose class equals whole-image inference (the model run on the whole scene; above 2,048 px a
   side, in 2,048 px tiles that each see 256 px of the scene around them, see
   `reference_classes`). Beside ours' defaults, the machine's limit for that run: the model alone
   (the backend and precision they ran, only the forward passes of the batches they ran, on
   random pixels made beforehand). Then the done-when summary: ours at its defaults against
   the fastest peer's km²/min, the lowest peer's peak RSS and the model alone.
3. Scaling with area: peak RSS of each tool with small_unet at 1x and 16x the area (a quarter of
   the prediction scene's side, and the prediction scene itself).

Each tool runs in a subprocess of its own (`--child`); peak RSS is the child's own high-water
mark (VmHWM: ru_maxrss of a child also counts the parent's RSS at the fork), seconds are the
tool's call alone (imports, model load and scene files are made before). Ours' ONNX export
(and int8 calibration) of a model file is made once, before its timed runs, by an untimed run on
a small scene: every later run finds it cached beside the model file, as a user's second map
does. Every peer gets the same weights as a plain `torch.nn.Module` that takes pixels the way
that peer hands them over (0-255 floats, or 0-1 after its /255), normalises them with the model
file's band statistics (`landcover.data.normalise`) and never picks class 0 (nodata: ours never
does).

Needs the peers: `make bench-peers` builds .venv-peers (pyproject's `peers` extra) and runs this.
A peer that is not installed, or that fails a case, gets a row saying so with its error.

Usage: python benchmarks/bench_peers.py [--quick] [--json PATH] [--only SECTION ...]
       [--predict-px 4096] [--train-seconds 90] [--ours VARIANT ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import rasterio
import torch
from bench_predict import _normalise, _recorded_batches, _save, model_alone
from machine import load_average
from resultfile import ResultFile, ResultTable, this_machine, today, write_result_file

from landcover.models.registry import build_model
from tiling.sources.classes import get_class_map
from tiling.synthetic.scenes import SynthConfig, synthesize_scenes

CHIP = 256
OVERLAP = CHIP // 4  # geoai predict_geotiff's default overlap
REFERENCE_TILE_PX = 2048  # reference_classes: tiles of the whole-image inference above this
REFERENCE_CONTEXT_PX = 256  # and the scene around each tile that it sees
EDGE_PX = 16
CLASS_MAP = get_class_map("chesapeake7to5")
SECTIONS = ["chips", "predict", "scaling"]
ALONE = "model alone (the limit of ours' defaults)"
ALONE_NOTE = (
    "the backend and precision ours' defaults ran, only the forward passes of the batches "
    "they ran, on random pixels made beforehand"
)
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
        "--predict-px",
        type=int,
        default=None,
        help="side of the prediction scene, the scaling's 16x [4096; --quick 1024]",
    )
    parser.add_argument(
        "--train-seconds", type=float, default=None, help="per model [90; --quick 15]"
    )
    parser.add_argument(
        "--ours",
        nargs="+",
        default=None,
        metavar="VARIANT",
        help="ours' rows besides the defaults, e.g. torch-fp32-chip onnxruntime-int8-auto "
        "[every backend, precision and window offered here]",
    )
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument(
        "--peers", nargs="*", choices=TOOLS[1:], default=TOOLS[1:], help="[all three]"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(json.loads(args.child))
        return
    quick = args.quick
    chip_side = args.chip_scene_px or (1792 if quick else 6720)
    predict_side = args.predict_px or (1024 if quick else 4096)
    train_s = args.train_seconds if args.train_seconds is not None else (15.0 if quick else 90.0)
    versions = peer_versions()
    machine = _machine()
    offered = ours_variants(precisions_offered())
    variants = [v for v in offered if args.ours is None or v.name in args.ours]
    print(f"# bench_peers ({'quick' if quick else 'full'}) — {machine}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print("ours: defaults, " + ", ".join(v.name for v in variants))
    tables: list[ResultTable] = []
    command = "python benchmarks/bench_peers.py " + " ".join(sys.argv[1:])

    def save(done: str | None) -> None:
        """Write the tables so far to --json: after every table, so that a run stopped
        part-way (a time limit) leaves what it measured, saying what it lacks."""
        if not args.json:
            return
        conditions = f"load average {load_average():.1f} at the end; versions: " + ", ".join(
            f"{k} {v}" for k, v in versions.items()
        )
        if done is not None:
            conditions = f"stopped part-way: {done} only; " + conditions
        result = ResultFile(
            benchmark="bench_peers",
            command=command.strip(),
            machine=machine,
            date=today(),
            tables=list(tables),
            conditions=conditions,
            extra={"versions": versions},
        )
        write_result_file(args.json, result)

    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        work = Path(tmp)
        if {"predict", "scaling"} & set(args.only):
            models, store = prepare_models(work, args.models, train_s=train_s)
            runs = PredictionRuns(work)
            warm_up(runs, models, variants, store)
            if "predict" in args.only:
                table: ResultTable | None = None
                for name, model in models.items():  # a table after each model
                    one = prediction(
                        runs, {name: model}, variants, args.peers, store, side_px=predict_side
                    )
                    table = one if table is None else _joined(table, one)
                    tables[:] = [table, summary(table, side_px=predict_side)]
                    save(f"prediction of {', '.join(dict.fromkeys(str(r[0]) for r in table.rows))}")
                if table is not None and len(models) > 1:
                    _print_table(table)
            if "scaling" in args.only and "small_unet" in models:
                tables.append(
                    scaling(
                        runs,
                        models["small_unet"],
                        variants,
                        args.peers,
                        store,
                        side_px=predict_side,
                    )
                )
                save("prediction and scaling" if "chips" in args.only else None)
        if "chips" in args.only:
            tables.insert(0, chips(work, side_px=chip_side))
    save(None)
    if args.json:
        print(f"\nwrote {args.json}")


def _joined(first: ResultTable, second: ResultTable) -> ResultTable:
    """`first` with the rows of `second` (the same columns) after its own."""
    return ResultTable(
        first.name, first.title, first.columns, [*first.rows, *second.rows], first.note
    )


@dataclass(frozen=True)
class Variant:
    """One row of ours: `landcover predict` with `args` (none: our defaults)."""

    name: str
    backend: str = "default"
    precision: str = "default"
    window: str = "default"

    def args(self, store: str) -> list[str]:
        """The options of this row (the int8 row's calibration chips: `store`)."""
        if self.name == DEFAULTS:
            return []
        args = ["--backend", self.backend, "--precision", self.precision, "--window", self.window]
        return [*args, "--calibration", store] if self.precision == "int8" else args

    @property
    def label(self) -> str:
        return "ours (defaults)" if self.name == DEFAULTS else f"ours {self.name}"


DEFAULTS = "defaults"


def precisions_offered() -> list[tuple[str, str]]:
    """(backend, precision) pairs this `landcover predict` offers on this machine: torch and
    onnxruntime in fp32; torch bf16 where the CPU has AVX-512 BF16 or AMX; onnxruntime int8
    where `predict --help` lists `--precision int8` and `--calibration`."""
    pairs = [("torch", "fp32"), ("onnxruntime", "fp32")]
    if cpu_has_bf16():
        pairs.append(("torch", "bf16"))
    usage = subprocess.run(
        [sys.executable, "-m", "landcover", "predict", "--help"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    flat = " ".join(usage.split())
    start = flat.find("--precision [")
    choices = flat[start : flat.find("]", start)] if start >= 0 else ""
    if "int8" in choices and "--calibration" in flat:
        pairs.append(("onnxruntime", "int8"))
    return pairs


def cpu_has_bf16() -> bool:
    """Whether this CPU has AVX-512 BF16 or AMX (Linux: /proc/cpuinfo's flags)."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def ours_variants(pairs: Sequence[tuple[str, str]]) -> list[Variant]:
    """Ours' rows besides the defaults: each (backend, precision) with each window choice."""
    return [
        Variant(f"{backend}-{precision}-{window}", backend, precision, window)
        for backend, precision in pairs
        for window in ("chip", "auto")
    ]


def peer_versions() -> dict[str, str]:
    """Versions of landcover, torch and each peer ('not installed' where one is missing)."""
    out = {"landcover": f"{_version('landcover')} ({_tree_state()})", "torch": torch.__version__}
    for name, dist in PEER_DISTRIBUTIONS.items():
        out[name] = _version(dist)
    return out


def _tree_state() -> str:
    """The commit of the working tree this runs from, and whether the code differs from it."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "no git"
    changed = git("status", "--porcelain", "--", "landcover", "tiling")
    return f"{commit}, with uncommitted changes to landcover/ or tiling/" if changed else commit


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
    window_px: int = 0  # ours: the window edge predict chose
    ran: str = ""  # ours: the output's backend and precision tags
    batches: tuple[tuple[int, int], ...] = ()  # ours: the model's batches (windows, edge)
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
        window_px=int(record.get("window_px", 0)),
        ran=str(record.get("ran", "")),
        batches=tuple(tuple(b) for b in record.get("batches", ())),  # type: ignore[misc]
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


def reference_classes(model_path: str, image: str) -> npt.NDArray[np.uint8]:
    """The reference: the model on the whole scene, argmax over classes 1..n. A scene up to
    REFERENCE_TILE_PX a side runs in one forward pass; a larger one (a 4,096 px scene would
    take 8-13 GB of activations in one pass) in tiles of REFERENCE_TILE_PX, each run with
    REFERENCE_CONTEXT_PX of the scene around it and cropped to the tile: every pixel sees
    at least that much context on every side, no window edge of any tool lies near
    the tiles' edges any closer than in the scene, and nothing is blended."""
    with rasterio.open(image) as src:
        pixels = torch.from_numpy(src.read())[None]
    model = SameWeights(model_path, scale=1.0).eval()
    height, width = pixels.shape[-2:]
    out = np.zeros((height, width), dtype=np.uint8)
    tile, context = REFERENCE_TILE_PX, REFERENCE_CONTEXT_PX
    if max(height, width) <= tile:
        tile, context = max(height, width), 0
    with torch.inference_mode():
        for r in range(0, height, tile):
            for c in range(0, width, tile):
                r0, c0 = max(0, r - context), max(0, c - context)
                r1, c1 = min(height, r + tile + context), min(width, c + tile + context)
                x = pixels[..., r0:r1, c0:c1].contiguous(memory_format=torch.channels_last)
                classes = model(x)[0].argmax(0).numpy().astype(np.uint8)
                h, w = min(tile, height - r), min(tile, width - c)
                out[r : r + h, c : c + w] = classes[r - r0 : r - r0 + h, c - c0 : c - c0 + w]
    return out


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
    import landcover.prediction.runner as runner
    from landcover.cli.app import main as cli
    from landcover.prediction.blend import WindowLayout

    _import_what_predict_runs()

    args = ["predict", spec["model"], spec["image"], "--out", spec["out"], *spec["args"]]
    layouts: list[WindowLayout] = []
    prepare = getattr(runner, "prepare_prediction")  # noqa: B009 (imported there by name)

    def recording(*a: Any, **k: Any) -> Any:  # the windows predict lays out, as it runs
        prepared = prepare(*a, **k)
        layouts.append(prepared.layout)
        return prepared

    setattr(runner, "prepare_prediction", recording)  # noqa: B010

    def call() -> dict[str, Any]:
        with _recorded_batches() as batches:
            cli.main([*args, "--overwrite"], standalone_mode=False)
        with rasterio.open(spec["out"]) as src:
            tags = src.tags()
        layout = layouts[-1]
        size = layout.size
        return {
            "windows": [(r, c, size, size) for r in layout.row_starts for c in layout.col_starts],
            "window_px": size,
            "ran": f"{tags.get('LANDCOVER_BACKEND', '?')} {tags.get('LANDCOVER_PRECISION', '?')}",
            "batches": batches,
        }

    return call


def _import_what_predict_runs() -> None:
    """Import, before the clock starts, the modules `landcover predict` imports on first use
    (torch, onnxruntime, the prediction's modules, matplotlib for the quicklook): the
    peers' imports are made before their calls too."""
    import importlib

    for name in (
        "torch",
        "onnxruntime",
        "landcover.devices",
        "landcover.prediction.runner",
        "landcover.prediction.runtime",
        "landcover.prediction.backends.onnxmodel",
        "landcover.prediction.stacitem",
        "landcover.view.quicklook",
        "matplotlib.figure",
        "matplotlib.patches",
    ):
        with contextlib.suppress(ImportError):  # onnxruntime is an extra
            importlib.import_module(name)


def _predict_alone(spec: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The machine's limit for ours' run: the same backend and precision (the same export
    and batch padding, `load_window_model`) running only the forward passes of the batches
    ours ran, on random normalised pixels made before the clock starts."""
    from landcover.prediction.setup import FreedMemory

    FreedMemory().reuse()  # the heap as ours' run has it (activations reuse freed pages)
    backend, precision = spec["ran"].split()
    calibration = spec["store"] if precision == "int8" else None
    sizes = [(int(count), int(edge)) for count, edge in spec["batches"]]
    model, batches = model_alone(spec["model"], backend, precision, sizes, calibration=calibration)

    def call() -> dict[str, Any]:
        for x in batches:
            model(x)
        return {"ran": spec["ran"], "window_px": spec["batches"][0][1]}

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
    ("predict", "alone"): _predict_alone,
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


def prepare_models(
    work: Path, names: Sequence[str], *, train_s: float
) -> tuple[dict[str, str], str]:
    """Model files of `names` (of MODELS), each trained `train_s` seconds on the chips of a
    store that `landcover tile` writes from two synthetic scenes, and that store (int8's
    calibration chips)."""
    from landcover.cli.app import main as cli

    synth = synthesize_scenes(SynthConfig(work / "train", scenes=2, size_px=768, seed=5))
    store = str(work / "train" / "chips.zarr")
    labels = str(synth.label_paths[0].parent)
    args = ["tile", *map(str, synth.image_paths), "--labels", labels, "--out", store]
    args += ["--class-map", "chesapeake7to5", "--min-valid", "0", "--val-fraction", "0"]
    cli.main([*args, "--stride", str(CHIP // 2)], standalone_mode=False)
    images, classes = _store_chips(store)
    mean = tuple(float(v) for v in images.mean(axis=(0, 2, 3), dtype=np.float64))
    std = tuple(float(v) for v in images.std(axis=(0, 2, 3), dtype=np.float64))
    paths = {name: str(work / f"{name}.pt") for name in names}
    for name in names:
        trained, steps, loss = train_model(name, images, classes, mean, std, train_s)
        print(f"({name} trained {train_s:.0f} s on {len(images)} chips: {steps} steps, "
              f"final loss {loss:.3f})")  # fmt: skip
        _save(Path(paths[name]), trained, name, mean, std)
    return paths, store


def _store_chips(store: str) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """A chip store's images (N, bands, chip, chip) and class labels (N, chip, chip)."""
    import zarr

    group = zarr.open_group(store, mode="r")
    out = []
    for key in ("images", "labels"):
        array = group[key]
        assert isinstance(array, zarr.Array)  # the store's contract
        out.append(np.asarray(array[...], dtype=np.uint8))
    return out[0], out[1]


def train_model(
    name: str,
    images: npt.NDArray[np.uint8],
    labels: npt.NDArray[np.uint8],
    mean: tuple[float, ...],
    std: tuple[float, ...],
    seconds: float,
) -> tuple[torch.nn.Module, int, float]:
    """Model `name` of the registry trained for `seconds` on random 128 px crops of the
    chips, 8 a step (AdamW, cross-entropy ignoring nodata): its steps and smoothed loss."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    model = build_model(name, num_classes=CLASS_MAP.num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    xs = torch.from_numpy(_normalise(images, mean, std))
    ys = torch.from_numpy(labels.astype(np.int64))
    crop, batch = 128, 8
    started, done, loss_value = time.perf_counter(), 0, math.nan
    model.train()
    while time.perf_counter() - started < seconds:
        k = rng.integers(len(xs), size=batch)
        r, c = rng.integers(CHIP - crop, size=2)
        logits = model(xs[k, :, r : r + crop, c : c + crop])
        loss = torch.nn.functional.cross_entropy(
            logits, ys[k, r : r + crop, c : c + crop], ignore_index=0
        )
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        done += 1
        value = float(loss.detach())
        loss_value = 0.9 * loss_value + 0.1 * value if done > 1 else value
    return model.eval(), done, loss_value


def _predict_scene(work: Path, side_px: int) -> str:
    folder = work / f"scene-{side_px}"
    if not folder.exists():
        synthesize_scenes(SynthConfig(folder, scenes=1, size_px=side_px, seed=11))
    return str(next((folder / "naip").glob("*.tif")))


class PredictionRuns:
    """Prediction runs by (tool, model, scene, ours' options), each run once: the scaling
    table's 16x runs are the prediction table's small_unet runs."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.done: dict[tuple[str, str, str, tuple[str, ...]], tuple[Run, str]] = {}
        self.variants: dict[tuple[str, str, str], tuple[Run, str]] = {}

    def get(self, tool: str, model: str, image: str, args: Sequence[str] = ()) -> tuple[Run, str]:
        """The run of `tool` (ours with `args`) with `model` on `image` and the class raster
        it wrote."""
        key = (tool, model, image, tuple(args))
        if key not in self.done:
            out_dir = self.work / f"pred-{len(self.done)}-{tool}"
            out_dir.mkdir(parents=True)
            out = out_dir / "classes.tif"
            spec = {
                "section": "predict",
                "tool": tool,
                "model": model,
                "image": image,
                "args": list(args),
                "out": str(out),
                "out_dir": str(out_dir / "rv"),
                "work": str(out_dir),
            }
            started = time.perf_counter()
            run = run_child(spec)
            print(
                f"({tool} {Path(model).stem} {Path(image).parent.parent.name} {' '.join(args)}: "
                f"{f'{run.seconds:.1f} s' if run.ok else run.error}, "
                f"{time.perf_counter() - started:.0f} s wall, load {load_average():.1f})",
                flush=True,
            )
            if tool == "rastervision":
                out = out_dir / "rv" / "labels.tif"
            self.done[key] = (run, str(out))
        return self.done[key]

    def alone(self, model: str, image: str, ours: Run, store: str) -> Run:
        """The model alone on the batches `ours` ran, with its backend and precision: the
        machine's limit for that run (`_predict_alone`)."""
        key = ("alone", model, image, (ours.ran,))
        if key not in self.done:
            spec = {
                "section": "predict",
                "tool": "alone",
                "model": model,
                "ran": ours.ran,
                "batches": [list(b) for b in ours.batches],
                "store": store,
            }
            run = run_child(spec)
            print(
                f"(model alone {Path(model).stem} {ours.ran}: "
                f"{f'{run.seconds:.1f} s' if run.ok else run.error}, load {load_average():.1f})",
                flush=True,
            )
            self.done[key] = (run, "")
        return self.done[key][0]

    def ours(self, model: str, image: str, variant: Variant, store: str) -> tuple[Run, str, str]:
        """Ours' run of `variant` (after the defaults), its class raster, and a note where it
        is another row's run (`same_as`)."""
        defaults, _ = self.get("ours", model, image)
        same = self.same_as(model, image, variant, defaults)
        if same is None:
            run, out = self.get("ours", model, image, variant.args(store))
            note = ""
        else:
            run, out = same
            what = "the defaults" if run is defaults else "window chip (torch on the CPU)"
            note = "the same run as " + what
        self.variants[(model, image, variant.name)] = (run, out)
        return run, out, note

    def same_as(
        self, model: str, image: str, variant: Variant, defaults: Run
    ) -> tuple[Run, str] | None:
        """The run that `variant` would repeat, where the program's own choices make it the
        same command: ours' defaults when they ran this backend, precision and window (the
        defaults' output says what ran), or the chip window for torch on the CPU (`--window
        auto` runs the chip there, landcover.prediction.windows.choose_window_px)."""
        if variant.name == DEFAULTS:
            return None
        if (
            defaults.ok
            and defaults.ran == f"{variant.backend} {variant.precision}"
            and variant.window == "chip"
            and defaults.window_px == CHIP
        ):
            return self.done[("ours", model, image, ())]
        if variant.backend == "torch" and variant.window == "auto" and _no_gpu():
            return self.variants.get((model, image, variant.name.replace("-auto", "-chip")))
        return None


def _no_gpu() -> bool:
    return not torch.cuda.is_available()


def warm_up(
    runs: PredictionRuns, models: dict[str, str], variants: Sequence[Variant], store: str
) -> None:
    """Ours' ONNX export (and int8 calibration) of each model file, made once by an untimed
    run on a small scene: later runs find it cached beside the model file. Our defaults pick
    onnxruntime only for predictions of more than a few million window pixels, so the
    onnxruntime fp32 export is made whatever the rows."""
    image = _predict_scene(runs.work, 512)
    wanted = {("onnxruntime", "fp32")} | {
        (v.backend, v.precision) for v in variants if v.backend == "onnxruntime"
    }
    for model in models.values():
        for backend, precision in sorted(wanted):
            variant = Variant("warm-up", backend, precision, "chip")
            run, _ = runs.get("ours", model, image, variant.args(store))
            if not run.ok:
                print(f"(warm-up of {backend} {precision} failed: {run.error})")


def prediction(
    runs: PredictionRuns,
    models: dict[str, str],
    variants: Sequence[Variant],
    peers: Sequence[str],
    store: str,
    *,
    side_px: int,
) -> ResultTable:
    """km²/min, peak RSS and seam agreement on one scene for each model: ours at its defaults
    and in each of `variants`, and each of `peers` at its defaults."""
    image = _predict_scene(runs.work, side_px)
    valid = valid_pixels(image)
    km2 = side_px * side_px / 1e6
    rows: list[list[Any]] = []
    for name, model in models.items():
        started = time.perf_counter()
        reference = reference_classes(model, image)
        print(f"({name}: reference in {time.perf_counter() - started:.0f} s)")
        done: list[tuple[str, Variant | None, Run, str, str]] = []  # tool, variant, run, out, note
        for tool in peers:
            run, out = runs.get(tool, model, image)
            done.append((tool, None, run, out, ""))
        for variant in [Variant(DEFAULTS), *variants]:
            run, out, note = runs.ours(model, image, variant, store)
            done.append(("ours", variant, run, out, note))
            if variant.name == DEFAULTS and run.ok and run.batches:
                alone = runs.alone(model, image, run, store)
                alone = replace(alone, batches=run.batches)
                done.append(("alone", None, alone, "", ALONE_NOTE))
        peer_rates = [
            km2 / r.seconds * 60 for t, _, r, _, _ in done if t not in ("ours", "alone") and r.ok
        ]
        fastest = max(peer_rates, default=math.nan)
        for tool, shown, run, out, note in [*done[len(peers) :], *done[: len(peers)]]:
            if tool == "alone":
                rate = km2 / run.seconds * 60 if run.ok else None
                rows.append(
                    [
                        name,
                        ALONE,
                        "",
                        "",
                        "",
                        run.ran or None,
                        run.window_px or None,
                        sum(count for count, _ in run.batches) or None,
                        None if rate is None else round(rate, 3),
                        None if rate is None else round(rate / fastest, 2),
                        round(run.peak_rss_bytes / MIB) if run.ok else None,
                        None,
                        None,
                        note if run.ok else run.error,
                    ]
                )
                continue
            label = shown.label if shown is not None else tool
            asked = (shown.backend, shown.precision, shown.window) if shown else ("",) * 3
            if not run.ok:
                rows.append([name, label, *asked, None, None, None, None, None, None, None, None,
                             run.error])  # fmt: skip
                continue
            classes = _read_classes(out)
            near = near_window_edges(classes.shape, run.windows) & valid
            rate = km2 / run.seconds * 60
            rows.append(
                [
                    name,
                    label,
                    *asked,
                    run.ran or None,
                    run.window_px or run.windows[0][2],
                    len(run.windows),
                    round(rate, 3),
                    round(rate / fastest, 2),
                    round(run.peak_rss_bytes / MIB),
                    _share(classes == reference, near),
                    _share(classes == reference, valid),
                    note,
                ]
            )
        majority = np.bincount(reference.ravel()).max() / reference.size
        print(f"({name}: whole-image inference's most common class covers {majority:.1%})")
    table = ResultTable(
        name="predict",
        title=(
            f"Prediction: one {side_px} x {side_px} px scene ({km2:.2f} km² at 1 m), CPU: ours "
            "at its defaults and at each backend, precision and window, each peer at its "
            "defaults"
        ),
        columns=[
            "model",
            "tool",
            "--backend",
            "--precision",
            "--window",
            "ran",
            "window px",
            "windows",
            "km²/min",
            "/ fastest peer",
            "peak RSS MiB",
            f"agreement within {EDGE_PX} px of window edges",
            "agreement, all valid pixels",
            "note",
        ],
        rows=rows,
        note=(
            "ran: the backend and precision the output's tags record; / fastest peer: km²/min "
            "over the fastest peer's on the same model; agreement: share of pixels whose class "
            "equals whole-image inference with the same weights, of the scene's valid pixels "
            "(nodata pixels, which ours leaves empty and the peers classify, are not counted)"
        ),
    )
    _print_table(table)
    return table


def summary(table: ResultTable, *, side_px: int) -> ResultTable:
    """The done-when of the prediction table: ours at its defaults against the fastest
    peer's km²/min (target 1.5x) at seam agreement >= 0.999, its peak RSS against the
    lowest peer's, and its km²/min against the model alone's (target 0.9x)."""
    col = {name: k for k, name in enumerate(table.columns)}
    seam = f"agreement within {EDGE_PX} px of window edges"
    rows: list[list[Any]] = []
    for model in dict.fromkeys(row[0] for row in table.rows):
        mine = [r for r in table.rows if r[0] == model]
        ours = next(r for r in mine if r[col["tool"]] == "ours (defaults)")
        peers = [r for r in mine if not str(r[col["tool"]]).startswith("ours")]
        peers = [r for r in peers if r[col["km²/min"]] is not None]
        if ours[col["km²/min"]] is None or not peers:
            rows.append([model, None, None, None, None, None, None, None, "no result"])
            continue
        peers = [r for r in peers if r[col["tool"]] != ALONE]
        limit = next((r for r in mine if r[col["tool"]] == ALONE), None)
        of_limit = (
            round(_number(ours[col["km²/min"]]) / _number(limit[col["km²/min"]]), 2)
            if limit is not None and limit[col["km²/min"]] is not None
            else None
        )
        fast = max(peers, key=lambda r: _number(r[col["km²/min"]]))
        low = min(peers, key=lambda r: _number(r[col["peak RSS MiB"]]))
        ratio = _number(ours[col["km²/min"]]) / _number(fast[col["km²/min"]])
        agreement = ours[col[seam]]
        rss, low_rss = ours[col["peak RSS MiB"]], low[col["peak RSS MiB"]]
        met = [
            ratio >= 1.5,
            agreement is not None and _number(agreement) >= 0.999,
            _number(rss) <= _number(low_rss),
            of_limit is not None and of_limit >= 0.9,
        ]
        rows.append(
            [
                model,
                ours[col["km²/min"]],
                f"{fast[col['tool']]} {fast[col['km²/min']]}",
                round(ratio, 2),
                agreement,
                rss,
                f"{low[col['tool']]} {low_rss}",
                of_limit,
                ", ".join(
                    f"{what} {'met' if ok else 'NOT met'}"
                    for what, ok in zip(("1.5x", "seam", "RSS", "0.9x limit"), met, strict=True)
                ),
            ]
        )
    summary_table = ResultTable(
        name="summary",
        title=f"Done when: ours at its defaults against the peers ({side_px} px scene)",
        columns=[
            "model",
            "ours km²/min",
            "fastest peer km²/min",
            "ours / fastest (target ≥ 1.5)",
            f"ours' agreement within {EDGE_PX} px of window edges (target ≥ 0.999)",
            "ours' peak RSS MiB",
            "lowest peer's peak RSS MiB (target: ours ≤)",
            "ours / model alone (target ≥ 0.9)",
            "targets",
        ],
        rows=rows,
    )
    _print_table(summary_table)
    return summary_table


def valid_pixels(image: str) -> npt.NDArray[np.bool_]:
    """The scene's pixels that are not nodata: not 0 in every band (ours' --zero-nodata
    default, and the synthetic scenes' declared nodata) nor the declared nodata value in
    every band."""
    with rasterio.open(image) as src:
        pixels, nodata = src.read(), src.nodata
    valid: npt.NDArray[np.bool_] = pixels.any(axis=0)
    if nodata is not None and nodata != 0:
        valid &= (pixels != nodata).any(axis=0)
    return valid


def _number(cell: Any) -> float:
    return math.nan if cell is None else float(cell)


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


def scaling(
    runs: PredictionRuns,
    model: str,
    variants: Sequence[Variant],
    peers: Sequence[str],
    store: str,
    *,
    side_px: int,
) -> ResultTable:
    """Peak RSS of each tool predicting with `model` at 1x and 16x the area (a scene of a
    quarter of `side_px`, and `side_px`): ours at its defaults and in its onnxruntime fp32
    row, each peer at its defaults."""
    small = _predict_scene(runs.work, side_px // 4)
    large = _predict_scene(runs.work, side_px)
    cases: list[tuple[str, str, Variant | None]] = [("ours (defaults)", "ours", Variant(DEFAULTS))]
    cases += [(v.label, "ours", v) for v in variants if v.name == "onnxruntime-fp32-chip"]
    cases += [(tool, tool, None) for tool in peers]
    rows: list[list[Any]] = []
    for label, tool, variant in cases:
        done: list[Run] = []
        for image in (small, large):
            if variant is None:
                run, _ = runs.get(tool, model, image)
            else:
                run, _, _ = runs.ours(model, image, variant, store)
            if not run.ok:
                rows.append([label, None, None, None, None, None, None, run.error])
                break
            done.append(run)
        else:
            peak = [r.peak_rss_bytes / MIB for r in done]
            growth = [(r.peak_rss_bytes - r.before_rss_bytes) / MIB for r in done]
            rows.append(
                [
                    label,
                    " / ".join(r.ran for r in done) if tool == "ours" else None,
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
            f"Peak RSS as the area grows: small_unet, {side_px // 4} px and {side_px} px "
            "square scenes (1x and 16x the area)"
        ),
        columns=[
            "tool",
            "ran (1x / 16x)",
            "1x peak MiB",
            "16x peak MiB",
            "16x / 1x (target for ours ≤ 1.1)",
            "1x growth in the call MiB",
            "16x growth in the call MiB",
            "error",
        ],
        rows=rows,
        note=(
            "peak: the process's high-water RSS (imports and model included); growth: the "
            "peak minus the high-water mark before the tool's call; the 16x runs are the "
            "prediction table's"
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
