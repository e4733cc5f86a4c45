"""`landcover demo` before its pipeline: what it may remove, and what it refuses up front.

None of these tests runs the pipeline: the first stage (synthesis) is replaced by one that
stops the demo, so a test sees the output directory exactly as the demo prepared it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from landcover import cli, demo
from landcover.demo import DEMO_ENTRIES, DEMO_MARKER, DemoConfig, check_demo_config
from landcover.errors import LandcoverError

STOPPED = "stopped before the pipeline (test)"


@pytest.fixture(autouse=True)
def no_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(*args: Any, **kwargs: Any) -> None:
        raise LandcoverError(STOPPED)

    monkeypatch.setattr(demo, "synthesize_scenes", stop)


def run_demo(*args: str) -> Result:
    return CliRunner().invoke(cli.main, ["demo", *args])


def earlier_demo(out: Path, marker: dict[str, Any] | None = None) -> None:
    """What a finished demo leaves (a few of its names), with its marker."""
    (out / "data" / "naip").mkdir(parents=True)
    (out / "data" / "naip" / "scene.tif").write_bytes(b"tif")
    (out / "report").mkdir()
    (out / "report" / "report.html").write_text("<html>")
    (out / "landcover.tif").write_bytes(b"cog")
    (out / ".landcover.tif.1a2b.cog.part.tif").write_bytes(b"killed mid-write")
    if marker is None:
        marker = {"format": "landcover-demo", "version": 1, "state": "done"}
        marker["entries"] = list(DEMO_ENTRIES)
    (out / DEMO_MARKER).write_text(json.dumps(marker))


def assert_prepared(out: Path, result: Result) -> None:
    """The demo got as far as its first stage, with a fresh marker and none of its old output."""
    assert result.exit_code == 2, result.output
    assert result.output.endswith(f"error: {STOPPED}\n")
    marker = json.loads((out / DEMO_MARKER).read_text())
    assert (marker["state"], marker["entries"]) == ("running", list(DEMO_ENTRIES))
    for name in ("data", "report", "landcover.tif", ".landcover.tif.1a2b.cog.part.tif"):
        assert not (out / name).exists(), name


@pytest.mark.parametrize(
    "marker",
    [None, {"state": "done", "map": "landcover.tif"}],  # this version's marker, an older one
    ids=["marker", "older-marker"],
)
def test_a_rerun_removes_only_what_the_demo_wrote(
    tmp_path: Path, marker: dict[str, Any] | None
) -> None:
    out = tmp_path / "demo-output"
    earlier_demo(out, marker)
    (out / "my-notes.txt").write_text("keep me")
    (out / "my-runs").mkdir()
    result = run_demo("--out", str(out))
    assert_prepared(out, result)
    assert (out / "my-notes.txt").read_text() == "keep me"
    assert (out / "my-runs").is_dir()


def test_out_dot_keeps_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier_demo(tmp_path)
    (tmp_path / "thesis.tex").write_text("three years")
    monkeypatch.chdir(tmp_path)
    result = run_demo("--out", ".")
    assert_prepared(tmp_path, result)
    assert (tmp_path / "thesis.tex").read_text() == "three years"


def test_a_directory_without_a_marker_is_written_beside_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "thesis.tex").write_text("three years")
    monkeypatch.chdir(tmp_path)
    result = run_demo("--out", ".")
    assert result.output.endswith(f"error: {STOPPED}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [DEMO_MARKER, "thesis.tex"]


def test_a_demo_name_that_no_demo_wrote_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()  # the user's own data/, no demo marker
    (tmp_path / "data" / "field-survey.csv").write_text("plot,class")
    result = run_demo("--out", str(tmp_path))
    assert result.exit_code == 2
    assert result.output == (
        f"error: {tmp_path}: already holds data, which no earlier demo there wrote; "
        "choose an empty or new --out\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert (tmp_path / "data" / "field-survey.csv").exists()


def test_a_foreign_demo_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / DEMO_MARKER).write_text('{"name": "another tool"}')
    (tmp_path / "landcover.tif").write_bytes(b"someone's map")
    result = run_demo("--out", str(tmp_path))
    assert result.exit_code == 2
    assert f"error: {tmp_path / DEMO_MARKER}: not the marker of a landcover demo" in result.output
    assert (tmp_path / "landcover.tif").read_bytes() == b"someone's map"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "bad.json: not valid JSON"),
        (None, "bad.json: no such file; pass the path of a cluster.json"),
    ],
)
def test_a_bad_cluster_file_is_refused_before_anything_is_written(
    tmp_path: Path, content: str | None, message: str
) -> None:
    cluster_json = tmp_path / "bad.json"
    if content is not None:
        cluster_json.write_text(content)
    out = tmp_path / "out"
    result = run_demo("--out", str(out), "--cluster", str(cluster_json))
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and message in result.output
    assert result.output.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("scenes", ["2", "1", "0"])
def test_fewer_than_three_scenes_are_refused_up_front(tmp_path: Path, scenes: str) -> None:
    out = tmp_path / "out"
    result = run_demo("--out", str(out), "--scenes", scenes)
    assert result.exit_code == 2
    assert result.output == (
        f"error: demo --scenes {scenes}: one scene is held out, and fewer than two training "
        "scenes do not teach the model enough to pass the accuracy floor; pass --scenes 3 or "
        "more\n"
    )
    assert not out.exists()


def test_too_few_training_chips_are_refused_up_front(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_demo("--out", str(out), "--scenes", "4", "--size", "256")
    assert result.exit_code == 2
    assert result.output == (
        "error: demo --scenes 4 --size 256: about 9 training chips (3 tiled scene(s) of 4 "
        "chips of 128 px, one scene held out, 20% for validation), but training at 2 workers "
        "x batch 8 needs 16; pass a larger --size or more --scenes\n"
    )
    assert not out.exists()


def test_three_scenes_at_the_default_size_pass_the_checks(tmp_path: Path) -> None:
    # two scenes tiled (128 chips, about 102 for training) for 2 workers x batch 8
    spec = check_demo_config(DemoConfig(out_dir=tmp_path, scenes=3, cluster_json=None))
    assert spec.engine == "local"


def test_the_training_runs_epoch_lines_reach_the_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's epoch lines and run ends, named by worker count, instead of a silent
    minute per run (the stages before training stubbed out)."""
    image = tmp_path / "scene.tif"
    monkeypatch.setattr(
        demo, "synthesize_scenes", lambda config: SimpleNamespace(image_paths=[image] * 4)
    )
    monkeypatch.setattr(demo, "tile", lambda config: None)
    monkeypatch.setattr(demo, "_check_store", lambda tiled, config: None)

    def sweep(config: Any, *, on_run: Any, on_progress: Any) -> None:
        on_progress(1, "epoch 1/6: train loss 0.9000, ...")
        on_run(SimpleNamespace(workers=1, status="done", wall_time_s=41.6))
        raise LandcoverError(STOPPED)

    monkeypatch.setattr(demo, "run_sweep", sweep)
    result = run_demo("--out", str(tmp_path / "demo"))
    assert result.exit_code == 2, result.output
    assert "      workers 1: epoch 1/6: train loss 0.9000, ...\n      workers 1: done, 42s\n" in (
        result.output
    )
