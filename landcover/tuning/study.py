"""`landcover tune`'s search: an Optuna study whose trials are normal training runs.

```
OUT/study.db        the study (Optuna's RDB storage on SQLite): trials, params, scores
OUT/trial-NNN/      trial NNN's run directory (model.pt, metrics.jsonl, run.json, ...)
OUT/trials.md       the table of trials; OUT/trials.png its figure (landcover.tuning.results)
```

Storage, the lock, interrupted trials and --overwrite: `landcover.tuning.studydir`.

A rerun of the same command resumes: it runs trials until N have finished (complete or pruned).
The study remembers its settings (the search space and the training configuration), and a rerun
with others is refused unless `overwrite`, which removes the study, the trial dirs and the
results. The TPE sampler is seeded with `seed` + the number of trials already in the study, so
a resumed search does not draw its first trials again.

Pruning: after every epoch, a trial reports its val mIoU; the median pruner stops a trial whose
val mIoU is below the median of earlier trials at the same epoch (from epoch 2, once 3 trials
have completed). An in-process trial raises `optuna.TrialPruned` from the trainer's epoch-end
callback, which runs after the epoch's metrics line, model.pt and checkpoint are written, so a
pruned trial's run dir is a consistent, resumable run of fewer epochs. A `cluster` trial is one
job, awaited: its epochs are reported from its metrics.jsonl after the job, so it is never
pruned mid-run (the pruner still sees its curve).
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.engine import LaunchOptions, launch_job
from cluster.engines import engine_info
from cluster.redact import Redactor
from cluster.spec import ClusterSpec
from landcover.errors import TuneError
from landcover.scaling.metricsfile import read_finished_epochs
from landcover.training.config import TrainConfig, parse_training, train_parser
from landcover.training.launch import WORKER_MODULE, training_job
from landcover.training.rundir import METRICS_FILE
from landcover.tuning.precheck import check_trial_values
from landcover.tuning.results import TrialRow, best_row, write_results
from landcover.tuning.space import NOT_TUNABLE, NumberRange, SearchSpace
from landcover.tuning.studydir import (
    RUN_DIR_ATTR,
    clear_search,
    exclusive,
    open_study,
    requeue_interrupted,
    trial_dir,
    trial_row,
    val_mious,
)

if TYPE_CHECKING:
    import optuna

__all__ = [
    "STUDY_MAY_CHANGE",
    "STUDY_MUST_MATCH",
    "TuneConfig",
    "TuneResult",
    "require_optuna",
    "run_study",
    "tune_training",
]

logger = logging.getLogger(__name__)

_FINISHED = ("COMPLETE", "PRUNED")
# set by the search, never by the training arguments after `--`
# the parameters a search sets itself: its trials' run dirs, epochs, seed, one worker each
_SET_BY_TUNE = ("out_dir", "epochs", "seed", "resume", "overwrite", "nproc")
# A rerun into OUT resumes its study. It may change the trial budget (and moves or overwrites
# OUT); every other TuneConfig field (the training options of `extra_args` one by one) must
# match the study's settings (`_settings`), or the rerun is refused naming both values.
STUDY_MAY_CHANGE = ("trials", "out_dir", "overwrite")
STUDY_MUST_MATCH = ("store", "space", "epochs", "seed", "extra_args", "cluster", "entry_module")


@dataclass(frozen=True, slots=True)
class TuneConfig:
    """One search: the store, the space, N trials of `epochs` epochs into `out_dir`, the other
    training options (`extra_args`, as after `landcover tune ... --`), the sampler's and the
    trials' seed, and the cluster to run each trial on (None: in this process)."""

    store: str
    space: SearchSpace
    trials: int
    epochs: int
    out_dir: str
    seed: int = 0
    extra_args: tuple[str, ...] = field(default=(), repr=False)  # may hold an account key
    cluster: ClusterSpec | None = None
    entry_module: str = WORKER_MODULE
    overwrite: bool = False


@dataclass(frozen=True, slots=True)
class TuneResult:
    """Every trial of the study, how many this call ran, the best complete trial, the files."""

    out_dir: Path
    rows: tuple[TrialRow, ...]
    ran: int
    table_path: Path
    plot_path: Path

    @property
    def best(self) -> TrialRow | None:
        return best_row(self.rows)


def require_optuna() -> Any:
    """The optuna module, or one TuneError line naming the extra to install."""
    try:
        import optuna
    except ImportError:
        raise TuneError(
            "landcover tune needs optuna, which is not installed: pip install 'landcover[tune]'"
        ) from None
    return optuna


def tune_training(config: TuneConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """The training configuration every trial starts from (parsed from the store, epochs, seed
    and `extra_args` by `landcover train`'s click options, the ones the search sets refused
    by parameter; its run dir is trial 0's), checked against every value of the space, and a
    stand-in entry module's own arguments."""
    if config.trials < 1:
        raise TuneError(f"--trials {config.trials} must be >= 1")
    given = {
        "out_dir": str(trial_dir(Path(config.out_dir), 0)),
        "epochs": config.epochs,
        "seed": config.seed,
    }
    parsed = parse_training(
        [config.store, *config.extra_args],
        command=train_parser,
        defaults=given,
        strict=config.entry_module == WORKER_MODULE,
    )

    def set_by_tune(flag: str) -> Exception:
        return TuneError(
            f"{flag} is set by landcover tune (--out, --epochs, --seed, the trials' run "
            "dirs); remove it from the training arguments"
        )

    def searched(flag: str) -> Exception:
        return TuneError(f"{flag} is searched by --space; remove it from the training arguments")

    parsed.refuse_given(_SET_BY_TUNE, set_by_tune)
    parsed.refuse_given(config.space.names, searched)
    training, stand_in_args = parsed.config, parsed.extra_args
    config.space.check(training)
    return training, stand_in_args


def run_study(
    config: TuneConfig,
    options: LaunchOptions | None = None,
    *,
    pruner: optuna.pruners.BasePruner | None = None,
    on_trial: Callable[[TrialRow], None] | None = None,
) -> TuneResult:
    """Run trials until `config.trials` have finished; see the module docstring. `options`:
    how cluster trials are launched; `pruner`: instead of the median pruner (tests)."""
    require_optuna()
    import optuna

    # optuna's lines ("Trial 3 finished ...") through logging, as every library's, not its
    # own stderr handler
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    training, stand_in_args = tune_training(config)
    if config.entry_module == WORKER_MODULE:  # a stand-in worker takes its own options
        check_trial_values(config.space, training, cluster=config.cluster)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive(out):
        if config.overwrite:
            clear_search(out)
        study, storage = open_study(out, _settings(config, training), pruner)
        study.sampler = optuna.samplers.TPESampler(seed=config.seed + len(study.trials))
        requeue_interrupted(storage, study)
        finished = sum(t.state.name in _FINISHED for t in study.trials)
        remaining = max(0, config.trials - finished)
        if remaining == 0:
            logger.info("%s: %d trials have finished; nothing to run", out, finished)
        trial_run = _TrialRunner(config, training, stand_in_args, options or LaunchOptions())
        started = _started(study)

        def trial_done(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
            if on_trial is not None:
                on_trial(trial_row(out, trial))

        try:
            study.optimize(
                trial_run, n_trials=remaining, callbacks=[trial_done], gc_after_trial=True
            )
        finally:
            rows = tuple(trial_row(out, t) for t in study.get_trials(deepcopy=False))
            table_path, plot_path = write_results(out, rows)
    return TuneResult(out, rows, _started(study) - started, table_path, plot_path)


class _TrialRunner:
    """The objective: one trial, a training run into OUT/trial-NNN, scored by its best val
    mIoU; in this process (pruned from the epoch-end callback) or as a cluster job."""

    def __init__(
        self,
        config: TuneConfig,
        training: TrainConfig,
        stand_in_args: tuple[str, ...],
        options: LaunchOptions,
    ) -> None:
        self.config = config
        self.training = training
        self.stand_in_args = stand_in_args
        self.options = replace(options, wait=True)

    def __call__(self, trial: optuna.Trial) -> float:
        run_dir = trial_dir(Path(self.config.out_dir), trial.number)
        trial.set_user_attr(RUN_DIR_ATTR, run_dir.name)
        params = _suggest(trial, self.config.space)
        config = replace(self.training, out_dir=str(run_dir), **params)
        if run_dir.exists():  # left by an interrupted search: never trusted
            shutil.rmtree(run_dir)
        logger.info("trial %d: %s into %s", trial.number, params, run_dir)
        if self.config.cluster is None:
            self._train_here(trial, config)
        else:
            self._train_on_cluster(trial, config, self.config.cluster)
        return _best_val_miou(run_dir)

    def _train_here(self, trial: optuna.Trial, config: TrainConfig) -> None:
        import optuna

        from landcover.training import TrainCallbacks, train

        def on_epoch_end(epoch: int, record: Mapping[str, Any]) -> None:
            miou = record.get("val_miou")
            if not (isinstance(miou, float) and math.isfinite(miou)):
                return
            trial.report(miou, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"val mIoU {miou:.4f} after epoch {epoch}")

        train(config, callbacks=TrainCallbacks(on_epoch_end=on_epoch_end))

    def _train_on_cluster(
        self, trial: optuna.Trial, config: TrainConfig, spec: ClusterSpec
    ) -> None:
        job = training_job(
            spec, config, entry_module=self.config.entry_module, extra_args=self.stand_in_args
        )
        launch_job(spec, job, self.options)
        for record in read_finished_epochs(Path(config.out_dir) / METRICS_FILE):
            if record.val_miou is not None and math.isfinite(record.val_miou):
                trial.report(record.val_miou, record.epoch)


def _suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for p in space:
        if isinstance(p, NumberRange) and p.integer:
            params[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
        elif isinstance(p, NumberRange):
            params[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
        else:
            params[p.name] = trial.suggest_categorical(p.name, list(p.values))
    return params


def _best_val_miou(run_dir: Path) -> float:
    scores = val_mious(run_dir)
    if not scores:
        raise TuneError(
            f"{run_dir}: no epoch has a val mIoU, which ranks the trials; tile the store with "
            "val chips (landcover tile --val-fraction)"
        )
    return max(scores)


def _started(study: optuna.Study) -> int:
    """Trials that have started (queued ones have not)."""
    return sum(t.state.name != "WAITING" for t in study.get_trials(deepcopy=False))


def _settings(config: TuneConfig, training: TrainConfig) -> dict[str, Any]:
    """What makes two searches the same (a rerun must match it: `studydir.open_study`): the
    space and the trials' configuration (every training option but NOT_TUNABLE's, which
    are TuneConfig's own or credentials), the store (and, where the trials run here, the
    digest of its chips, so that a store tiled again under the same URL is not mixed into a
    search), and where the trials run; secrets redacted (a SAS token in the store URL, storage
    options), since they are kept in study.db. `--trials` may change: it is the budget."""
    values = training.to_json()
    trials = {k: v for k, v in values.items() if k not in NOT_TUNABLE}
    settings = {
        "space": str(config.space),
        "store": values["store_url"],
        "epochs": config.epochs,
        "seed": config.seed,
        "training": trials,
        "cluster": None if config.cluster is None else config.cluster.name,
        "cluster_workers": None if config.cluster is None else config.cluster.workers,
        "entry_module": config.entry_module,
    }
    runs_here = config.cluster is None or engine_info(config.cluster.engine).runs_here
    if config.entry_module == WORKER_MODULE and runs_here:
        settings["store_digest"] = _store_digest(training)
    redacted: dict[str, Any] = Redactor().data(settings)
    return redacted


def _store_digest(training: TrainConfig) -> str:
    """The digest of the trials' chips (`store_identity`: read from the store's attributes)."""
    from landcover.training.resume import store_identity  # imports torch
    from tiling.chipstore.store import open_store

    store = open_store(training.store_url, storage_options=training.storage_options)
    return str(store_identity(training.store_url, store.summary)["digest"])
