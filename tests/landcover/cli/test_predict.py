"""`landcover predict` as ranks: the rank mode an engine runs, `--nproc N` on the local engine
and `cluster launch -- predict` on a real SLURM cluster, each COG compared byte for byte with
a one-process run (the library's protocol is tested in tests/landcover/prediction)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.slurm_testbed import SlurmTestbed, two_node_slurm_job
from tests.support.stageruns import cog_bytes, predict_args, rank_args, run


def without_time(line: str) -> str:
    return re.sub(r" in [0-9.]+ s$", "", line)


def test_rank_mode_reads_its_place_and_only_rank_0_speaks(
    predict_inputs: tuple[Path, Path, Path], one_prediction: tuple[Path, str], tmp_path: Path
) -> None:
    """`stage-rank URL` as an engine runs it (here rank 1, then rank 0, in this process)."""
    out = tmp_path / "lc.tif"
    env = {
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",  # read, never dialled: the ranks share files only
        "MASTER_PORT": "29500",
        "LANDCOVER_ERROR_DIR": str(tmp_path),
    }
    second = run(*rank_args(*predict_args(predict_inputs, out)), env={**env, "RANK": "1"})
    assert second.exit_code == 0, second.output
    assert second.output == ""  # rank 0 speaks for the job
    assert any(p.suffix == ".json" for p in Path(f"{out}.parts").iterdir())
    first = run(*rank_args(*predict_args(predict_inputs, out)), env={**env, "RANK": "0"})
    assert first.exit_code == 0, first.output
    summary = [line for line in first.output.splitlines() if line.startswith("wrote ")]
    assert without_time(summary[0]) == without_time(
        one_prediction[1].replace(str(one_prediction[0]), str(out))
    )
    assert cog_bytes(out) == cog_bytes(one_prediction[0])
    assert not Path(f"{out}.parts").exists()


@pytest.mark.slow
def test_nproc_2_writes_the_bytes_of_one_process(
    predict_inputs: tuple[Path, Path, Path], one_prediction: tuple[Path, str], tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    result = run(*predict_args(predict_inputs, out, "--nproc", "2", "--no-quicklook"))
    assert result.exit_code == 0, result.output
    assert cog_bytes(out) == cog_bytes(one_prediction[0])
    summary = [line for line in result.output.splitlines() if line.startswith("wrote ")]
    # rank 0's lines, printed once, by the parent: the one-process lines
    assert len(summary) == 2 and summary == result.stdout.splitlines()[-2:]
    assert without_time(summary[0]) == without_time(
        one_prediction[1].replace(str(one_prediction[0]), str(out))
    )
    assert summary[1] == f"wrote {out.with_suffix('.p.tif')}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lc.p.tif", "lc.tif"]


@pytest.mark.slow  # two rank processes
def test_nproc_refuses_an_existing_output_as_one_process_does(
    predict_inputs: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "lc.tif"
    out.write_bytes(b"keep")
    result = run(*predict_args(predict_inputs, out, "--nproc", "2"))
    one = run(*predict_args(predict_inputs, out))
    assert result.exit_code == one.exit_code != 0
    assert result.output == one.output
    assert f"{out} exists; pass --overwrite" in result.output
    assert out.read_bytes() == b"keep"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cluster_launch_predicts_across_two_slurm_nodes(
    slurm_testbed: SlurmTestbed,
    predict_inputs: tuple[Path, Path, Path],
    one_prediction: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`landcover cluster launch slurm.json -- predict ...`: one rank on each SLURM node, the
    COG byte-identical to a one-process run."""
    monkeypatch.chdir(tmp_path)  # the engine keeps the job's logs in ./slurm-logs
    cluster_json, env = two_node_slurm_job(slurm_testbed, tmp_path)
    out = tmp_path / "slurm" / "lc.tif"
    result = run(
        "cluster", "launch", str(cluster_json), "--wait", "--", *predict_args(predict_inputs, out),
        env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert cog_bytes(out) == cog_bytes(one_prediction[0])
    assert not Path(f"{out}.parts").exists()
