"""`landcover tile` as ranks: `--nproc N` on the local engine and `cluster launch -- tile` on a
real SLURM cluster, each store compared byte for byte with a one-process run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rasterio

import tiling.tiler.stager
from tests.azurite import Azurite
from tests.conftest import REPO_ROOT
from tests.support.chipstores import snapshot
from tests.support.slurm_testbed import SlurmTestbed, two_node_slurm_job
from tests.support.stageruns import rank_args, run, tile_args
from tiling.runtime.machine import cores_per_rank
from tiling.tiler.staging import PartStaging

# Imported by every rank (PYTHONPATH): rank 1 is SIGKILLed right after staging its first part.
KILL_RANK_1 = """
import os
from tiling.tiler.staging import PartStaging

_put = PartStaging.put

def put_then_die(self, part):
    _put(self, part)
    if os.environ.get("RANK") == "1":
        os.kill(os.getpid(), 9)

PartStaging.put = put_then_die
"""


def test_rank_mode_reads_its_place_and_only_rank_0_speaks(
    images: Path, one_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stage-rank URL` as an engine runs it (here one rank after the other, in process)."""
    monkeypatch.setattr(tiling.tiler.stager, "COUNT_WAIT_S", 0.2)  # no rank 0 to count its sources
    out = tmp_path / "env.zarr"
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500", "LANDCOVER_ERROR_DIR": str(tmp_path)}  # fmt: skip
    second = run(*rank_args(*tile_args(images, out)), env={**env, "RANK": "1"})
    assert second.exit_code == 0, second.output
    assert second.output == ""  # quiet, its log included: rank 0 speaks for the job
    assert len(list(Path(f"{out}.parts").glob("*.part"))) == 2
    first = run(*rank_args(*tile_args(images, out)), env={**env, "RANK": "0"})
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith(f"wrote {out}: ")
    assert "from 4 sources in " in first.stdout
    assert first.stdout.rstrip().endswith("with 2 ranks x 1 workers")
    assert "committed 4 parts" in first.stderr  # its log, at INFO
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})


@pytest.mark.slow
def test_nproc_2_writes_the_bytes_of_one_process(
    images: Path, one_store: Path, tmp_path: Path
) -> None:
    out = tmp_path / "two.zarr"
    result = run(*tile_args(images, out, "--nproc", "2"))
    assert result.exit_code == 0, result.output
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})
    assert not Path(f"{out}.parts").exists()
    summary_lines = [line for line in result.output.splitlines() if line.startswith("wrote ")]
    assert len(summary_lines) == 1  # rank 0's line, printed once, by the parent
    line = summary_lines[0]
    assert line in result.stdout.splitlines()
    assert line.startswith(f"wrote {out}: ") and line.endswith("with 2 ranks x 1 workers")
    assert "from 4 sources in" in line


def test_nproc_2_refuses_bad_input_as_one_process_does(images: Path, tmp_path: Path) -> None:
    """The ranks check the input (the parent starts them at once); they all refuse it, and
    the user reads the one line one process gives, nothing written."""
    out = tmp_path / "x.zarr"
    missing = tmp_path / "missing"
    two = run(*tile_args(missing, out, "--nproc", "2"))
    one = run(*tile_args(missing, out))
    assert two.exit_code == one.exit_code == 2
    assert two.output == one.output
    assert one.output.startswith(f"error: no image files match '{missing}/*.tif'")
    assert not out.exists() and not Path(f"{out}.parts").exists()


def test_a_rank_without_sources_leaves_its_cores_to_rank_0(images: Path, tmp_path: Path) -> None:
    """One source for two ranks: rank 1 has nothing to cut, so rank 0 reads with both ranks'
    share of the machine's cores (as one process would use them); the bytes are one process's."""
    one_image = tmp_path / "one"
    one_image.mkdir()
    (one_image / "a.tif").symlink_to(images / "a.tif")
    (tmp_path / "nlcd").symlink_to(images.parent / "nlcd")
    args = tile_args(one_image, tmp_path / "two.zarr", "--nproc", "2")
    at = args.index("--workers")
    two = run(*args[:at], *args[at + 2 :])  # the ranks choose their readers
    assert two.exit_code == 0, two.output
    per_rank = cores_per_rank(2)
    assert two.stdout.rstrip().endswith(f"with 2 ranks x {2 * per_rank} workers")
    one = run(*tile_args(one_image, tmp_path / "one.zarr"))
    assert one.exit_code == 0, one.output
    assert snapshot(str(tmp_path / "two.zarr"), {}) == snapshot(str(tmp_path / "one.zarr"), {})


def test_nproc_2_warns_about_an_input_once(images: Path, tmp_path: Path) -> None:
    """Every rank plans the same inputs; only rank 0 warns about them."""
    folder = tmp_path / "with-small"
    folder.mkdir()
    for tif in images.glob("*.tif"):
        (folder / tif.name).symlink_to(tif)
    small = folder / "small.tif"
    with rasterio.open(next(images.glob("*.tif"))) as src:
        profile = {**src.profile, "width": 10, "height": 10}
        with rasterio.open(small, "w", **profile) as dst:
            dst.write(src.read(window=((0, 10), (0, 10))))
    (tmp_path / "nlcd").symlink_to(images.parent / "nlcd")
    result = run(*tile_args(folder, tmp_path / "two.zarr", "--nproc", "2"))
    assert result.exit_code == 0, result.output
    warning = f"{small}: 10 x 10 px is smaller than --chip-size 64; skipped"
    assert result.output.count(warning) == 1, result.output


@pytest.mark.slow
@pytest.mark.parametrize("rerun", [["--nproc", "2"], []], ids=["two-ranks", "one-process"])
def test_a_rank_killed_midway_then_a_rerun_equals_the_uninterrupted_store(
    images: Path, one_store: Path, tmp_path: Path, rerun: list[str]
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_RANK_1)
    out = tmp_path / "killed.zarr"
    killed = run(*tile_args(images, out, "--nproc", "2"), env={"PYTHONPATH": f"{hook}:{REPO_ROOT}"})
    assert killed.exit_code != 0, killed.output
    staged = sorted(p.name.split(".")[0] for p in Path(f"{out}.parts").iterdir())
    assert "000001" in staged  # rank 1's first part survived its death
    done = run(*tile_args(images, out, *rerun))
    assert done.exit_code == 0, done.output
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})
    assert not Path(f"{out}.parts").exists()


@pytest.mark.slow
@pytest.mark.azurite
def test_nproc_2_to_an_az_url_gives_the_ranks_the_storage_options(
    images: Path,
    tmp_path: Path,
    azurite: Azurite,
) -> None:
    """The ranks get --storage-options by environment (never argv) and write to az://."""
    options = azurite.storage_options
    stores = [azurite.url(f"{name}-{tmp_path.name}.zarr") for name in ("one", "two")]
    for store, extra in zip(stores, ([], ["--nproc", "2"]), strict=True):
        result = run(*tile_args(images, store, "--storage-options", json.dumps(options), *extra))
        assert result.exit_code == 0, result.output
    assert snapshot(stores[1], options) == snapshot(stores[0], options)
    assert PartStaging(stores[1], options).names() == frozenset()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cluster_launch_tiles_across_two_slurm_nodes(
    slurm_testbed: SlurmTestbed,
    images: Path,
    one_store: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`landcover cluster launch slurm.json -- tile ...`: one rank on each SLURM node, the
    store byte-identical to a one-process run."""
    monkeypatch.chdir(tmp_path)  # the job's slurm-logs/ go there, not into the checkout
    cluster_json, env = two_node_slurm_job(slurm_testbed, tmp_path)
    out = tmp_path / "slurm.zarr"
    result = run(
        "cluster", "launch", str(cluster_json), "--wait", "--", *tile_args(images, out), env=env
    )
    assert result.exit_code == 0, result.output
    assert snapshot(str(out), {}) == snapshot(str(one_store), {})
    assert not Path(f"{out}.parts").exists()
    logs = sorted((tmp_path / "slurm-logs" / "landcover").glob("job-*-rank-*.log"))
    assert len(logs) == 2  # one rank per node
    assert "with 2 ranks x 1 workers" in logs[0].read_text()  # rank 0 speaks for the job
