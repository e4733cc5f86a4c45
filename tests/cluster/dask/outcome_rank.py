"""A rank for `test_ranks`: `python -m tests.cluster.dask.outcome_rank succeeds|refuses|crashes`
ends as landcover's entry points do (a refused input and a crash leave their one-line record,
`cluster.failures`)."""

from __future__ import annotations

import os
import sys

from cluster.failures import record_worker_error


def main() -> None:
    outcome = sys.argv[1]
    rank = int(os.environ["RANK"])
    if outcome == "refuses":
        record_worker_error("no image files match 'x/*.tif'", rank=rank, bad_input=True)
        sys.exit(2)
    if outcome == "crashes":
        record_worker_error("internal error: KeyError: 'x'", rank=rank)
        sys.exit(3)


if __name__ == "__main__":
    main()
