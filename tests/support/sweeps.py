"""A launch that trains nothing: it writes the metrics.jsonl of an ideally scaling run, for the
tests of `landcover scale`, the sweep and the scaling report."""

from __future__ import annotations

import json
from pathlib import Path

from cluster.engine import LaunchOptions, LaunchResult, Plan
from cluster.errors import LaunchError
from tests.landcover.scaling.runfiles import metrics_line


class FakeLaunch:
    """Writes metrics.jsonl as a run of `workers` workers would (every field the report reads),
    with ideal scaling."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.calls: list[int] = []

    def __call__(self, plan: Plan, options: LaunchOptions | None = None) -> LaunchResult:
        assert options is not None and options.wait  # sweeps wait for every run
        workers = plan.spec.workers
        self.calls.append(workers)
        out = Path(str(plan.job.output_dir))
        out.mkdir(parents=True)
        (out / "logs").mkdir()
        if workers == self.fail_at:
            raise LaunchError(f"training failed on simulated node 0 (exit code 1); logs: {out}")
        argv = plan.job.argv
        epochs = int(argv[argv.index("--epochs") + 1])
        threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else 1
        with (out / "metrics.jsonl").open("w") as f:
            for epoch in range(1, epochs + 1):
                # the first epoch pays warm-up: three times the others
                time_s = (3 if epoch == 1 else 1) * 8.0 / workers
                record = metrics_line(
                    epoch, workers, time_s, samples_per_s=80.0 / time_s, threads_per_worker=threads
                )
                f.write(json.dumps(record) + "\n")
        return LaunchResult(
            "local", f"job-{workers}", "succeeded", str(out), str(out / "logs"), 1.0
        )
