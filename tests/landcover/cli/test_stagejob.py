"""`tile` and `predict` as ranks: the argv each rank runs; `cluster plan -- tile|predict`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from landcover.options import STORAGE_OPTIONS_ENV
from landcover.prediction.config import PredictConfig
from landcover.stageconfig import (
    PredictStage,
    StageConfigError,
    publish_stage,
    read_stage,
    stage_url,
)
from landcover.stagerun import rank_job
from tests.conftest import REPO_ROOT
from tests.support.cli import invoke
from tests.support.clusterspecs import ACCOUNT_KEY, AZUREML_SPEC, KUBERNETES_SPEC, write_json

SECRET_OPTIONS = json.dumps({"account_name": "acct", "account_key": ACCOUNT_KEY})


def predict_stage(tmp_path: Path, **options: Any) -> PredictStage:
    config = PredictConfig(
        model="model.pt", images=(str(tmp_path / "a.tif"),), out=str(tmp_path / "lc.tif"),
        **options,
    )  # fmt: skip
    return PredictStage(config)


def test_a_rank_job_runs_the_published_stage_and_gets_storage_options_by_environment_only(
    tmp_path: Path,
) -> None:
    """Every rank runs `stage-rank URL` (no option of the user's line, so no scanner of it),
    the stage at URL holds every option but the storage options, which go by environment."""
    stage = predict_stage(tmp_path, storage_options=json.loads(SECRET_OPTIONS), block_px=64)
    job = rank_job(stage, logging_args=["-v"])
    assert job.entry_module == "landcover"
    assert job.argv == ("-v", "stage-rank", stage_url(stage))
    assert stage_url(stage).startswith(f"{tmp_path}/lc.tif.parts/stage-")
    assert json.loads(job.secret_env[STORAGE_OPTIONS_ENV])["account_key"] == ACCOUNT_KEY
    assert job.inputs == {} and job.outputs == {}
    assert publish_stage(stage) == stage_url(stage)
    text = Path(stage_url(stage)).read_text()
    assert ACCOUNT_KEY not in text and "acct" not in text
    read = read_stage(stage_url(stage), storage_options=json.loads(SECRET_OPTIONS))
    assert read == stage


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda text: text.replace('"block_px":64', '"block_px":65'), "does not match the digest"),
        (lambda text: text[:-5], "unreadable stage file"),
        (None, "no stage file there"),
    ],
    ids=["edited", "cut short", "missing"],
)
def test_a_rank_refuses_a_stage_file_that_is_not_the_one_published(
    tmp_path: Path, damage: Any, said: str
) -> None:
    stage = predict_stage(tmp_path, block_px=64)
    url = publish_stage(stage)
    if damage is None:
        Path(url).unlink()
    else:
        Path(url).write_text(damage(Path(url).read_text()))
    with pytest.raises(StageConfigError, match=said):
        read_stage(url)


@pytest.mark.parametrize(
    "document",
    [None, AZUREML_SPEC, KUBERNETES_SPEC, {"engine": "slurm", "targetNodeCount": 2}],
    ids=["local", "azureml", "kubernetes", "slurm"],
)
@pytest.mark.parametrize("stage", ["tile", "predict"])
def test_cluster_plan_runs_the_stage_as_ranks_without_secrets(
    tmp_path: Path, document: dict[str, Any] | None, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the stage's images are resolved by the launcher
    (tmp_path / "naip").mkdir()
    (tmp_path / "naip" / "a.tif").write_bytes(b"")
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
    out = "az://chips/va.zarr" if stage == "tile" else "lc.tif"
    assert any(f"stage-rank {out}.parts/stage-" in t for t in texts)
    assert not any("naip/*.tif" in t for t in texts)  # the ranks get the stage, not the line
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
    """`tile` and `predict` import the stack inside the command, where it is used: loading
    the commands, the stage runner and the local engine imports none of it (the launcher then
    imports only what resolving the inputs needs; no torch). The local engine's spec needs no
    pydantic (only reading a cluster.json does)."""
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
