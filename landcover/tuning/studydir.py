"""The search directory OUT of `landcover tune`: its files, the study's storage and settings,
the one-search-at-a-time lock, interrupted trials, and what `--overwrite` removes.

```
OUT/study.db        the study (Optuna's RDB storage on SQLite): trials, params, scores
OUT/trial-NNN/      trial NNN's run directory (model.pt, metrics.jsonl, run.json, ...)
OUT/trials.md       the table of trials; OUT/trials.png its figure (landcover.tuning.results)
OUT/.tune.lock      held (flock) while a search runs
```

Storage: SQLite, not Optuna's journal file. Every change of the study is one SQLite transaction,
and SQLite's own journal rolls back one that a kill cut short, so a killed search leaves a study
that opens as it was; its locks are the kernel's and die with the process. Optuna's journal file
backend (optuna 5: `JournalFileBackend`) instead leaves its lock file behind a kill (the next
search waits out a 30 s grace period), and a write cut short leaves a line without its newline
that the next append is glued to, after which the journal no longer reads ("Invalid log
format").

Only one `landcover tune` may use OUT at a time (an flock on OUT/.tune.lock), so a trial still
marked running when a search starts is one a kill interrupted: it is marked failed, and its
parameters are queued again (a fresh run in a new trial dir).
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from landcover.errors import TuneError
from landcover.outputlock import exclusive_writer
from landcover.scaling.metricsfile import read_finished_epochs
from landcover.training.config import OPTIONS
from landcover.training.rundir import METRICS_FILE
from landcover.tuning.results import PLOT_FILE, TABLE_FILE, TrialRow

if TYPE_CHECKING:
    import optuna

__all__ = [
    "RUN_DIR_ATTR",
    "STUDY_FILE",
    "STUDY_NAME",
    "TRIAL_PREFIX",
    "clear_search",
    "exclusive",
    "open_study",
    "requeue_interrupted",
    "setting_changes",
    "trial_dir",
    "trial_row",
    "val_mious",
]

logger = logging.getLogger(__name__)

STUDY_FILE = "study.db"
STUDY_NAME = "landcover-tune"
TRIAL_PREFIX = "trial-"
RUN_DIR_ATTR = "run_dir"  # a trial's user attribute: its run dir, relative to OUT
_LOCK_FILE = ".tune.lock"
_SETTINGS_ATTR = "landcover_settings"
# The median pruner compares a trial's val mIoU at an epoch with the completed trials' at that
# epoch: it needs a few of them, and the first epoch's score says little (warm-up).
_PRUNE_AFTER_TRIALS = 3  # completed trials before any pruning
_PRUNE_FROM_EPOCH = 2  # optuna: the earliest step a trial can be pruned at (steps are epochs)


def trial_dir(out: Path, number: int) -> Path:
    """OUT/trial-NNN, the run dir of trial `number`."""
    return out / f"{TRIAL_PREFIX}{number:03d}"


def val_mious(run_dir: Path) -> list[float]:
    """The val mIoU of every finished epoch of a run (epochs without one left out)."""
    records = read_finished_epochs(run_dir / METRICS_FILE)
    return [r.val_miou for r in records if r.val_miou is not None and math.isfinite(r.val_miou)]


def trial_row(out: Path, trial: optuna.trial.FrozenTrial) -> TrialRow:
    """A trial as a table row, its scores read from its run dir's metrics.jsonl."""
    run_dir = str(trial.user_attrs.get(RUN_DIR_ATTR, trial_dir(out, trial.number).name))
    records = read_finished_epochs(out / run_dir / METRICS_FILE)
    scores = val_mious(out / run_dir)
    return TrialRow(
        number=trial.number,
        params=dict(trial.params),
        best_val_miou=max(scores) if scores else None,
        epochs=len(records),
        state=trial.state.name.lower(),
        run_dir=run_dir,
    )


def _trial_dir(out: Path, number: int) -> Path:
    return out / f"{TRIAL_PREFIX}{number:03d}"


def open_study(
    out: Path, settings: dict[str, Any], pruner: optuna.pruners.BasePruner | None
) -> tuple[optuna.Study, optuna.storages.RDBStorage]:
    """The study of OUT/study.db and its storage, created with `settings` or checked against
    them."""
    import optuna

    path = out / STUDY_FILE
    existed = path.exists() and path.stat().st_size > 0
    if not existed:
        stale = sorted(p.name for p in out.glob(f"{TRIAL_PREFIX}*"))[:1]
        if stale:
            raise TuneError(
                f"{out} holds {stale[0]} but no {STUDY_FILE}; pass --overwrite to replace it or "
                "choose another --out"
            )
    storage = optuna.storages.RDBStorage(f"sqlite:///{path.resolve()}")
    study = optuna.create_study(
        storage=storage,
        study_name=STUDY_NAME,
        direction="maximize",
        pruner=pruner
        or optuna.pruners.MedianPruner(
            n_startup_trials=_PRUNE_AFTER_TRIALS, n_warmup_steps=_PRUNE_FROM_EPOCH
        ),
        load_if_exists=True,
    )
    old = study.user_attrs.get(_SETTINGS_ATTR)
    if not existed or old is None:
        study.set_user_attr(_SETTINGS_ATTR, settings)
        return study, storage
    changed = setting_changes(old, settings)
    if changed:
        raise TuneError(
            f"{out} holds a search with other settings ({'; '.join(changed[:3])}); pass "
            "--overwrite to replace it or choose another --out"
        )
    return study, storage


# How a refusal names each setting of `study._settings`; "training" is named by its options.
_SETTING_NAMES = {
    "space": "--space",
    "store": "STORE",
    "store_digest": "STORE content (digest)",
    "epochs": "--epochs",
    "seed": "--seed",
    "cluster": "--cluster-json cluster",
    "cluster_workers": "--cluster-json workers",
    "entry_module": "--entry-module",
}
_TRAINING_FLAGS = {option.name: option.flag.name for option in OPTIONS}


def setting_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Each setting of a study (`study._settings`) that `new` changes, with both values:
    `--epochs 3 (now 2)`, a training option by its flag (`--loss ce (now ce+dice)`). A setting
    that `old` did not record (a study of an older landcover) is not compared."""
    changes = []
    for key, value in new.items():
        if key not in old or old[key] == value:
            continue
        if key == "training" and isinstance(value, Mapping) and isinstance(old[key], Mapping):
            then = old[key]
            changes += [
                f"{_TRAINING_FLAGS.get(name, name)} {then[name]} (now {now})"
                for name, now in value.items()
                if name in then and then[name] != now
            ]
        else:
            changes.append(f"{_SETTING_NAMES.get(key, key)} {old[key]} (now {value})")
    return changes


def requeue_interrupted(storage: optuna.storages.RDBStorage, study: optuna.Study) -> None:
    """Trials left running by a killed search: marked failed, their params queued again."""
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(STUDY_NAME)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        logger.warning("trial %d was interrupted; running its parameters again", trial.number)
        study.enqueue_trial(dict(trial.params), skip_if_exists=False)


def clear_search(out: Path) -> None:
    """--overwrite: the study, the trial dirs and the results, nothing else of OUT."""
    for path in (out / STUDY_FILE, out / TABLE_FILE, out / PLOT_FILE):
        path.unlink(missing_ok=True)
    for trial_dir in out.glob(f"{TRIAL_PREFIX}*"):
        shutil.rmtree(trial_dir)


@contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """One search at a time in OUT: an flock, released by the kernel if the process dies
    (`landcover.outputlock`)."""
    busy = f"another landcover tune is using {out}"
    with exclusive_writer(out / _LOCK_FILE, busy, error=TuneError, remove=False):
        yield
