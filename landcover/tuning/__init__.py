"""Hyperparameter search (`landcover tune`): the search space (`space`), the Optuna study whose
trials are normal training runs (`study`), and its table and figure (`results`). Optuna is an
optional dependency (`pip install 'landcover[tune]'`), imported only when a search runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from landcover._lazy import lazy_exports

if TYPE_CHECKING:
    from landcover.tuning.results import TrialRow, format_trials_table, write_results
    from landcover.tuning.space import Choice, NumberRange, SearchSpace, parse_space
    from landcover.tuning.study import TuneConfig, TuneResult, require_optuna, run_study

__all__ = [
    "Choice",
    "NumberRange",
    "SearchSpace",
    "TrialRow",
    "TuneConfig",
    "TuneResult",
    "format_trials_table",
    "parse_space",
    "require_optuna",
    "run_study",
    "write_results",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Choice": "space",
        "NumberRange": "space",
        "SearchSpace": "space",
        "parse_space": "space",
        "TrialRow": "results",
        "format_trials_table": "results",
        "write_results": "results",
        "TuneConfig": "study",
        "TuneResult": "study",
        "require_optuna": "study",
        "run_study": "study",
    },
)
