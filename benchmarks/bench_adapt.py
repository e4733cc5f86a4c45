"""Test-time adaptation (`predict --adapt`) on held-out patches, unshifted and shifted.

Trains one small_unet per seed on 6 of the 8 real West Virginia patches (`--data`, e.g.
../shared/data/chesapeake-wv), then maps the 2 held-out patches with every `--adapt` value of
`--variants`: as they are, and under radiometric shifts of the kinds that differ between NAIP
flights (gain, gamma, per-band offsets, and all three). The statistics of each adaptation are
computed by `landcover.prediction.adapt` exactly as `predict` does (a fixed lattice of windows
of the model's chip over the held-out patches, per shifted set), and applied as `predict`
applies them (band statistics into the normalisation, BatchNorm buffers into a copy of the
model). Prints pixel accuracy per variant and set, the mean and spread over seeds, and each
variant's gain over `none`.

    python benchmarks/bench_adapt.py --data ../shared/data/chesapeake-wv --seeds 3 \\
        --json benchmarks/results/bench_adapt.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import rasterio
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from landcover.data.normalise import normalise
from landcover.models.modelfile import ModelMeta
from landcover.models.registry import build_model
from landcover.prediction.adapt import adapted_module, compute_adaptation
from landcover.prediction.adaptspec import parse_adapt
from tiling.sources.classes import get_class_map

CHIP = 64
VARIANTS = (
    "none",
    "bands:0.5",
    "bands:1",
    "bn:0.25",
    "bn:0.5",
    "bn:1",
    "bn-early:1",
    "bn+bands:0.5",
)
Image = npt.NDArray[np.uint8]


def _shift(
    fn: Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]],
) -> Callable[[Image], Image]:
    def apply(image: Image) -> Image:
        valid = image.any(axis=0)
        out = np.clip(np.rint(fn(image.astype(np.float64))), 1, 255).astype(np.uint8)
        return np.where(valid, out, 0).astype(np.uint8)

    return apply


OFFSETS = np.array([18.0, 8.0, -6.0, -15.0]).reshape(4, 1, 1)
SHIFTS: dict[str, Callable[[Image], Image]] = {
    "unshifted": lambda image: image,
    "gain 1.25": _shift(lambda x: x * 1.25),
    "gain 0.8": _shift(lambda x: x * 0.8),
    "gamma 0.8": _shift(lambda x: 255.0 * (x / 255.0) ** 0.8),
    "offsets": _shift(lambda x: x + OFFSETS),
    "all three": _shift(lambda x: 255.0 * ((x * 0.9 + OFFSETS).clip(0, 255) / 255.0) ** 1.15),
}


def load(data: Path) -> list[tuple[Image, npt.NDArray[np.uint8]]]:
    class_map = get_class_map("chesapeake7to5")
    pairs = []
    for naip in sorted(data.glob("*_naip.tif")):
        with rasterio.open(naip) as ds:
            image = ds.read()
        with rasterio.open(str(naip).replace("_naip.tif", "_lc.tif")) as ds:
            labels = class_map.apply(ds.read(1))
        pairs.append((image, np.asarray(labels, dtype=np.uint8)))
    return pairs


def train(
    pairs: list[tuple[Image, npt.NDArray[np.uint8]]], meta: ModelMeta, seed: int, steps: int
) -> torch.nn.Module:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = build_model("small_unet", in_channels=4, num_classes=meta.num_classes)
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    mean = torch.tensor(meta.band_mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(meta.band_std, dtype=torch.float32).view(1, -1, 1, 1)
    model.train()
    for _ in range(steps):
        xs, ys = [], []
        for _ in range(8):
            image, labels = pairs[rng.integers(len(pairs))]
            r, c = rng.integers(0, image.shape[1] - CHIP + 1, size=2)
            x, y = image[:, r : r + CHIP, c : c + CHIP], labels[r : r + CHIP, c : c + CHIP]
            if rng.random() < 0.5:
                x, y = x[:, :, ::-1], y[:, ::-1]
            k = int(rng.integers(4))
            xs.append(np.rot90(x, k, axes=(1, 2)).copy())
            ys.append(np.rot90(y, k).copy())
        batch = normalise(torch.from_numpy(np.stack(xs)), mean, std)
        target = torch.from_numpy(np.stack(ys)).long()
        loss = F.cross_entropy(model(batch), target, ignore_index=0)
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimiser.step()
    return model.eval()


def accuracy(
    model: torch.nn.Module,
    meta: ModelMeta,
    variant: str,
    images: list[Image],
    labels: list[npt.NDArray[np.uint8]],
) -> float:
    spec = parse_adapt(variant)
    pixels, valid = sample(images)
    adaptation = compute_adaptation(spec, meta, pixels, valid, model)
    module = adapted_module(model, adaptation.bn).eval()
    mean = torch.tensor(adaptation.band_mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(adaptation.band_std, dtype=torch.float32).view(1, -1, 1, 1)
    right = total = 0
    with torch.inference_mode():
        for image, truth in zip(images, labels, strict=True):
            x = normalise(torch.from_numpy(image[None]), mean, std)
            predicted = module(x).argmax(1)[0].numpy()
            known = truth > 0
            right += int((predicted[known] == truth[known]).sum())
            total += int(known.sum())
    return right / total


def sample(images: list[Image]) -> tuple[Image, npt.NDArray[np.bool_]]:
    """The windows `predict` would sample: the lattice of `adapt.sample_windows` per image."""
    from landcover.prediction.adapt import MIN_VALID_FRACTION, sample_windows

    kept, masks = [], []
    for image in images:
        for w in sample_windows(image.shape[1], image.shape[2], CHIP):
            window = image[:, w.row : w.row + CHIP, w.col : w.col + CHIP]
            valid = window.any(axis=0)
            if valid.mean() >= MIN_VALID_FRACTION:
                kept.append(window)
                masks.append(valid)
    return np.stack(kept), np.stack(masks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--held-out", type=int, nargs="+", default=[6, 7])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs = load(args.data)
    train_pairs = [p for i, p in enumerate(pairs) if i not in args.held_out]
    held = [p for i, p in enumerate(pairs) if i in args.held_out]
    stacked = np.concatenate([img[:, img.any(axis=0)] for img, _ in train_pairs], axis=1)
    meta = ModelMeta(
        architecture="small_unet",
        class_map=get_class_map("chesapeake7to5"),
        band_names=("red", "green", "blue", "nir"),
        band_mean=tuple(float(v) for v in stacked.mean(axis=1)),
        band_std=tuple(float(v) for v in stacked.std(axis=1)),
        chip_size=CHIP,
        resolution_m=1.0,
    )
    results: dict[tuple[str, str], list[float]] = {}
    started = time.perf_counter()
    for seed in range(args.seeds):
        model = train(train_pairs, meta, seed, args.steps)
        for shift, fn in SHIFTS.items():
            images = [fn(img) for img, _ in held]
            for variant in args.variants:
                score = accuracy(model, meta, variant, images, [lab for _, lab in held])
                results.setdefault((variant, shift), []).append(score)
        print(f"seed {seed} done ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    shifted = [s for s in SHIFTS if s != "unshifted"]
    print(
        f"# pixel accuracy on held-out patches {args.held_out}, small_unet, {args.steps} steps "
        f"of 8 x {CHIP} px chips, {args.seeds} seeds (mean ± sd over seeds)\n"
    )
    print("## adapt\n")
    header = ["variant", "unshifted", "shifted (mean)", *shifted, "Δ unshifted", "Δ shifted"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))

    def mean_sd(values: list[float]) -> str:
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.3f} ± {sd:.3f}"

    def shifted_means(variant: str) -> list[float]:
        return [statistics.mean(results[variant, s][i] for s in shifted) for i in range(args.seeds)]

    base_un, base_sh = results["none", "unshifted"], shifted_means("none")
    for variant in args.variants:
        un, sh = results[variant, "unshifted"], shifted_means(variant)
        d_un = [a - b for a, b in zip(un, base_un, strict=True)]
        d_sh = [a - b for a, b in zip(sh, base_sh, strict=True)]
        cells = [variant, mean_sd(un), mean_sd(sh)]
        cells += [f"{statistics.mean(results[variant, s]):.3f}" for s in shifted]
        cells += [f"{statistics.mean(d_un):+.3f} (min {min(d_un):+.3f})"]
        cells += [f"{statistics.mean(d_sh):+.3f} (min {min(d_sh):+.3f})"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    from resultfile import recording_tables

    with recording_tables("bench_adapt.py"):
        main()
