"""`tile` and `predict` as ranks: the argv each rank runs; `cluster plan -- tile|predict`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from landcover.cli.stagejob import RANK_FLAG, StageError, rank_argv, stage_job
from landcover.options import STORAGE_OPTIONS_ENV
from tests.conftest import REPO_ROOT
from tests.support.cli import invoke
from tests.support.clusterspecs import ACCOUNT_KEY, AZUREML_SPEC, KUBERNETES_SPEC, write_json

SECRET_OPTIONS = json.dumps({"account_name": "acct", "account_key": ACCOUNT_KEY})


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["a.tif", "--out", "s", "--nproc", "2"], ["a.tif", "--out", "s"]),
        (["--nproc=4", "a.tif", "--out", "s"], ["a.tif", "--out", "s"]),
        (
            ["a.tif", "--storage-options", SECRET_OPTIONS, "--out", "az://c/s"],
            ["a.tif", "--out", "az://c/s"],
        ),
        ([f"--storage-options={SECRET_OPTIONS}", "a.tif"], ["a.tif"]),
        # given twice (as a rerun of a rank's argv would): added once, before the arguments
        (["a.tif", RANK_FLAG], ["a.tif"]),
        # after `--` nothing is an option
        (["--out", "s", "--", "--nproc"], ["--out", "s", "--", "--nproc"]),
    ],
)
def test_rank_argv_drops_nproc_and_storage_options(args: list[str], expected: list[str]) -> None:
    assert rank_argv("tile", args, logging_args=["-v"]) == ["-v", "tile", RANK_FLAG, *expected]


def test_stage_job_gives_storage_options_by_environment_only() -> None:
    args = ["model.pt", "a.tif", "--out", "lc.tif", "--storage-options", SECRET_OPTIONS]
    job = stage_job("predict", args, storage_options=json.loads(SECRET_OPTIONS))
    assert job.entry_module == "landcover"
    assert ACCOUNT_KEY not in " ".join(job.argv)
    assert json.loads(job.secret_env[STORAGE_OPTIONS_ENV])["account_key"] == ACCOUNT_KEY
    assert job.inputs == {} and job.outputs == {}
    with pytest.raises(StageError, match="unknown stage 'train'"):
        stage_job("train", args)


@pytest.mark.parametrize(
    "document",
    [None, AZUREML_SPEC, KUBERNETES_SPEC, {"engine": "slurm", "targetNodeCount": 2}],
    ids=["local", "azureml", "kubernetes", "slurm"],
)
@pytest.mark.parametrize("stage", ["tile", "predict"])
def test_cluster_plan_runs_the_stage_as_ranks_without_secrets(
    tmp_path: Path, document: dict[str, Any] | None, stage: str
) -> None:
    spec = (
        REPO_ROOT / "cluster.json"
        if document is None
        else write_json(tmp_path / "c.json", document)
    )
    args = (
        ["naip/*.tif", "--labels", "lc/*.tif", "--out", "az://chips/va.zarr"]
        if stage == "tile"
        else ["model.pt", "naip/*.tif", "--bbox", "0,0,1,1", "--out", "lc.tif"]
    )
    result = invoke(
        "cluster", "plan", str(spec), "--out", str(tmp_path / "plan"),
        "--", stage, *args, "--storage-options", SECRET_OPTIONS,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    texts = [result.output, *(p.read_text() for p in (tmp_path / "plan").iterdir())]
    assert all(ACCOUNT_KEY not in t and "--storage-options" not in t for t in texts)
    assert any(RANK_FLAG in t and stage in t and "naip/*.tif" in t for t in texts)
    assert any(STORAGE_OPTIONS_ENV in t for t in texts[1:])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tile", "a.tif", "--out", "s", "--nproc", "2"], "--nproc is for `landcover tile`"),
        (["tile", "a.tif", "--out", "s", "--chip-size", "big"], "'big' is not a valid integer"),
        (["predict", "model.pt", "a.tif"], "Missing option '--out'"),
    ],
)
def test_cluster_stage_args_are_checked_by_the_command_first(args: list[str], message: str) -> None:
    result = invoke("cluster", "plan", str(REPO_ROOT / "cluster.json"), "--", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_python_dash_m_landcover_is_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "landcover", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: landcover")


def test_the_nproc_parent_starts_ranks_without_the_stack() -> None:
    """`tile` and `predict` import the stack inside the command, after the `--nproc` parent
    has started its ranks: each rank imports it, the parent never does (about a second of
    every run's wall time, two with torch). The local engine's spec needs no pydantic (only
    reading a cluster.json does)."""
    heavy = ("torch", "zarr", "rasterio", "pystac", "shapely", "pyproj", "pydantic")
    code = (
        "import sys, landcover.cli.tiling, landcover.cli.predict, cluster.local.engine; "
        "from cluster.spec import local_spec; local_spec(2); "
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT
    )
    assert done.stdout.strip() == "[]"


def test_a_rank_run_in_process_leaves_logging_as_it_found_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank logs with its rank at its level while the command runs, then the root logger's
    level and handlers' formats are restored (an in-process run must not change what later
    code, or a test's log capture, sees)."""
    import logging

    import click

    from landcover.cli.stagejob import enter_rank

    seen: list[tuple[int, str]] = []

    @click.command()
    @click.pass_context
    def rank_command(ctx: click.Context) -> None:
        env = enter_rank(ctx)
        handler = next(h for h in logging.getLogger().handlers if type(h) is logging.StreamHandler)
        assert handler.formatter is not None
        seen.append(
            (
                logging.getLogger().level,
                handler.formatter.format(
                    logging.LogRecord("x", logging.INFO, "f", 1, "hello", None, None)
                ),
            )
        )
        assert env.rank == 0

    root = logging.getLogger()
    handler = logging.StreamHandler()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        formatter = handler.formatter
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29500")
        result = CliRunner().invoke(rank_command, [])
        assert result.exit_code == 0, result.output
        assert seen[0][0] == logging.INFO and "rank 0 INFO x: hello" in seen[0][1]
        assert root.level == logging.WARNING and handler.formatter is formatter
        assert handler in root.handlers
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
