"""`landcover demo`: the whole pipeline on generated data (what `make demo` runs)."""

from __future__ import annotations

from pathlib import Path

import click

from landcover.demo import DemoConfig, run_demo
from landcover.options import cluster_json_option, out_dir_option


@click.command("demo")
@out_dir_option(
    "Output directory. The demo writes only its own names in it (listed in its "
    "demo.json); a rerun replaces what an earlier demo wrote there and keeps everything else.",
    default="demo-output",
)
@click.option(
    "--scenes",
    default=4,
    show_default=True,
    type=int,
    help="Synthetic scenes (3 or more): one is held out of training and scored.",
)
@click.option("--size", "size_px", default=1024, show_default=True, type=click.IntRange(min=256))
@click.option("--epochs", default=6, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
@cluster_json_option(
    "cluster.json for the training runs [default: ./cluster.json when there is one, "
    "else this machine]."
)
@click.option(
    "--accuracy-floor",
    default=0.70,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fail if the held-out scene's pixel accuracy is below this.",
)
def demo_command(
    out_dir: Path,
    scenes: int,
    size_px: int,
    epochs: int,
    seed: int,
    cluster_json: Path | None,
    accuracy_floor: float,
) -> None:
    """Synthesise scenes, tile, train at 1 and 2 workers, report, predict a region, evaluate."""
    config = DemoConfig(
        out_dir=out_dir,
        scenes=scenes,
        size_px=size_px,
        epochs=epochs,
        seed=seed,
        cluster_json=cluster_json,
        accuracy_floor=accuracy_floor,
    )
    total = 6
    counter = iter(range(1, total + 1))

    def on_stage(name: str) -> None:
        click.echo(f"[{next(counter)}/{total}] {name}", err=True)

    def on_progress(line: str) -> None:
        click.echo(f"      {line}", err=True)

    result = run_demo(config, on_stage=on_stage, on_progress=on_progress)
    held = result.held_out
    click.echo(
        "\n".join(
            [
                f"demo finished in {result.elapsed_s:.0f} s; everything is under {result.out_dir}",
                f"  scenes        {result.synth.image_paths[0].parent}",
                f"  chip store    {result.store.url} ({result.store.summary.num_chips} chips)",
                f"  runs          {result.sweep.path.parent} (metrics.jsonl per worker count)",
                f"  report        {result.report.html}",
                f"  model         {result.model_path}",
                f"  region        {result.region_path}",
                f"  map (COG)     {result.prediction.out}",
                f"  evaluation    {result.evaluation_dir}",
                f"map accuracy: {result.evaluation.pixel_accuracy:.3f} over the region, "
                f"{held.pixel_accuracy:.3f} (mIoU {held.mean_iou:.3f}) on the held-out scene "
                f"(floor {config.accuracy_floor:.2f})",
            ]
        )
    )
