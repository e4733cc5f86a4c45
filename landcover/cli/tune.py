"""`landcover tune`: a hyperparameter search whose trials are normal training runs
(`landcover.tuning`). Thin: parse the options into a `TuneConfig`, run the study, print the
table and the best trial."""

from __future__ import annotations

from pathlib import Path

import click

from cluster.clusterjson import load_cluster_spec
from cluster.engine import LaunchOptions
from landcover.options import cluster_json_option, out_dir_option
from landcover.outputs import check_can_create_in
from landcover.training.launch import WORKER_MODULE
from landcover.tuning.results import TrialRow, format_trials_table
from landcover.tuning.space import parse_space
from landcover.tuning.study import TuneConfig, require_optuna, run_study


@click.command("tune", context_settings={"ignore_unknown_options": True})
@click.argument("store")
@click.option("--trials", type=click.IntRange(min=1), required=True, help="Trials in all.")
@click.option(
    "--space",
    "space_text",
    required=True,
    help="Options to search: name=low:high[:log] (a range) or name=a|b (a choice), comma "
    "separated, e.g. lr=1e-4:1e-2:log,loss=ce|ce+dice,model=small_unet|unet_resnet18.",
)
@click.option("--epochs", type=click.IntRange(min=1), required=True, help="Epochs per trial.")
@out_dir_option(
    "Search directory: study.db, one run dir per trial (trial-NNN), trials.md and trials.png.",
    required=True,
)
@cluster_json_option("cluster.json to run each trial on as a job (default: in this process).")
@click.option("--seed", type=int, default=0, show_default=True, help="Sampler and training seed.")
@click.option("--overwrite", is_flag=True, help="Replace the search in OUT (default: resume it).")
@click.option("--entry-module", default=WORKER_MODULE, hidden=True)  # a stand-in worker (tests)
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def tune_command(
    ctx: click.Context,
    store: str,
    trials: int,
    space_text: str,
    epochs: int,
    out_dir: Path,
    cluster_json: Path | None,
    seed: int,
    overwrite: bool,
    entry_module: str,
    train_args: tuple[str, ...],
) -> None:
    """Search training options with Optuna: TPE sampling, median pruning on val mIoU.

    \b
    landcover tune chips.zarr --trials 20 --epochs 5 --out tune \\
        --space 'lr=1e-4:1e-2:log,loss=ce|ce+dice,model=small_unet|unet_resnet18'

    Each trial trains into OUT/trial-NNN. Rerunning the command resumes the search until
    --trials have finished. Other training options go after `--`.
    """
    check_can_create_in(out_dir, option="--out")
    require_optuna()
    config = TuneConfig(
        store=store,
        space=parse_space(space_text),
        trials=trials,
        epochs=epochs,
        out_dir=str(out_dir),
        seed=seed,
        extra_args=train_args,
        cluster=load_cluster_spec(cluster_json) if cluster_json is not None else None,
        entry_module=entry_module,
        overwrite=overwrite,
    )
    obj = ctx.find_root().obj
    quiet = bool(obj.get("quiet")) if isinstance(obj, dict) else False

    def trial_done(row: TrialRow) -> None:
        if not quiet:
            miou = "-" if row.best_val_miou is None else f"{row.best_val_miou:.4f}"
            click.echo(f"trial {row.number}: {row.state}, val mIoU {miou}", err=True)

    def worker_output(line: str) -> None:
        click.echo(line, err=True)

    options = LaunchOptions(on_output=None if quiet else worker_output)
    result = run_study(config, options, on_trial=trial_done)
    click.echo(format_trials_table(result.rows))
    best = result.best
    if best is None:
        click.echo("best: none (no trial completed)")
    else:
        click.echo(f"best: trial {best.number}, val mIoU {best.best_val_miou:.4f}: "
                   f"{result.out_dir / best.run_dir}")  # fmt: skip
    click.echo(f"table: {result.table_path}; plot: {result.plot_path}")
