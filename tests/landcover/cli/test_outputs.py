"""What every command that writes does with its outputs (`landcover.outputs`, the one policy).

Each class of failure runs across every command it applies to, through the CLI:

- a directory that takes no new files (read-only: /proc, where even root cannot create files,
  as tests/landcover/prediction/test_failures.py does) is one line naming the path and the fix,
  exit 2, before any work, nothing written;
- a full disk (the file system refusing to put a file in place: `os.replace` and `os.link`,
  the last step of every atomic writer, raise ENOSPC) is one line naming the output, exit 2,
  no temp file or half output left;
- a file that appears after a command's own existence check is never replaced, nor is a
  user's symlink (dangling or not) without --overwrite;
- two outputs of one command at one file, or an output at one of its inputs, are refused
  before any work, even with --overwrite.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from landcover.scaling import sweep
from tests.landcover.evaluation.maps import PRED, TRUTH_RAW, X0, Y0, write, write_prediction
from tests.landcover.prediction.inputs import pixels, write_image, write_model
from tests.landcover.scaling.runfiles import write_run
from tests.landcover.tuning.stand_in_worker import replace_trainer
from tests.support.cli import invoke
from tests.support.clusterspecs import AZUREML_SPEC
from tests.support.sweeps import FakeLaunch

FAKE_WORKER = "tests.cluster.fake_worker"
LOCAL_SPEC = {"name": "one", "engine": "local", "vmSize": "local", "targetNodeCount": 1}
USER_TEXT = "the user's own file\n"


@dataclass(frozen=True)
class Inputs:
    """Small inputs of every command, made once per module."""

    root: Path
    model: Path
    scene: Path
    prediction: Path
    truth: Path
    runs: Path
    cluster_json: Path
    store: str


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, tiny_store: str) -> Inputs:
    root = tmp_path_factory.mktemp("inputs")
    runs = root / "runs"
    for workers in (1, 2):
        write_run(runs, f"workers-{workers}", workers=workers, epoch_times=[9.0, 8.0 / workers])
    cluster_json = root / "cluster.json"
    cluster_json.write_text(json.dumps(LOCAL_SPEC))
    return Inputs(
        root=root,
        model=write_model(root / "model.pt", constant_class=3),
        scene=write_image(root / "scene.tif", pixels(75, 90, seed=1)),
        prediction=write_prediction(root / "pred.tif"),
        truth=write(root / "truth.tif", TRUTH_RAW),
        runs=runs,
        cluster_json=cluster_json,
        store=tiny_store,
    )


# Each writer: its arguments with its output under `out` (other outputs under `spare`), and the
# output path the messages name.
Args = tuple[list[str], Path]
Writer = Callable[[Inputs, Path, Path], Args]


def _synth(i: Inputs, out: Path, spare: Path) -> Args:
    return ["synth", str(out / "data"), "--scenes", "1", "--size", "64"], out / "data"


def _tile(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "chips.zarr"
    return ["tile", str(i.scene), "--out", str(target), "--chip-size", "32"], target


def _train(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "run"
    args = ["train", i.store, "--out", str(target), "--epochs", "1", "--tracking", "none"]
    return [*args, "--batch-size", "8", "--device", "cpu"], target


def _tune(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "tune"
    args = ["tune", i.store, "--trials", "1", "--epochs", "1", "--space", "lr=1e-4:1e-2:log"]
    return [*args, "--out", str(target)], target


def _export(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "model.torchscript"
    return ["export", str(i.model), "--format", "torchscript", "--out", str(target)], target


def _predict(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "lc.tif"
    return ["predict", str(i.model), str(i.scene), "--out", str(target), "--device", "cpu"], target


def _predict_probabilities(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "p.tif"
    args, _ = _predict(i, spare, spare)
    return [*args, "--probabilities", str(target)], target


def _predict_stac_item(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "lc.json"
    args, _ = _predict(i, spare, spare)
    return [*args, "--stac-item", str(target)], target


def _evaluate(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "eval"
    return ["evaluate", str(i.prediction), "--truth", str(i.truth), "--out", str(target)], target


def _sample(i: Inputs, out: Path, spare: Path, *, suffix: str = ".csv") -> Args:
    target = out / f"sample{suffix}"
    return ["sample", str(i.prediction), "--out", str(target), "--size", "19"], target


def _labelled_sample(i: Inputs) -> Path:
    """Every labelled pixel of the prediction as a point, its reference its own class."""
    path = i.root / "labelled.csv"
    rows = ["x,y,reference"]
    for r, row in enumerate(PRED):
        rows += [f"{X0 + c + 0.5},{Y0 - r - 0.5},{code}" for c, code in enumerate(row) if code]
    path.write_text("\n".join(rows) + "\n")
    return path


def _evaluate_reference(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "area"
    args = ["evaluate", str(i.prediction), "--reference", str(_labelled_sample(i))]
    return [*args, "--out", str(target)], target


def _change(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "change"
    return ["change", str(i.prediction), str(i.prediction), "--out", str(target)], target


def _report_scaling(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "report"
    return ["report", "scaling", str(i.runs), "--out", str(target)], target


def _scale(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "sweep"
    args = ["scale", i.store, "--workers", "1", "--epochs", "1", "--out", str(target)]
    return [*args, "--entry-module", FAKE_WORKER], target


def _cluster_plan(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "plan"
    args = ["cluster", "plan", str(i.cluster_json), "--out", str(target)]
    return [*args, "--", "train", "chips.zarr", "--out", "/shared/run"], target


def _demo(i: Inputs, out: Path, spare: Path) -> Args:
    target = out / "demo"
    return ["demo", "--out", str(target), "--cluster", str(i.cluster_json)], target


WRITERS: dict[str, Writer] = {
    "synth": _synth,
    "tile": _tile,
    "train": _train,
    "tune": _tune,
    "export": _export,
    "predict --out": _predict,
    "predict --probabilities": _predict_probabilities,
    "predict --stac-item": _predict_stac_item,
    "evaluate": _evaluate,
    "evaluate --reference": _evaluate_reference,
    "sample .csv": _sample,
    "sample .gpkg": lambda i, out, spare: _sample(i, out, spare, suffix=".gpkg"),
    "change": _change,
    "report scaling": _report_scaling,
    "scale": _scale,
    "cluster plan": _cluster_plan,
    "demo": _demo,
}


def quick_runs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune's trials and scale's runs in milliseconds: the stand-in trainer and launches."""
    if name == "tune":
        replace_trainer(monkeypatch)
    if name == "scale":
        monkeypatch.setattr(sweep, "launch_plan", FakeLaunch())


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """The command failed with exit 2 and ended with one error line (progress lines of the
    work before may precede it), no traceback; returns that line."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == lines[-1:], result.stderr
    assert "internal error" not in errors[0] and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def leftovers(root: Path) -> list[str]:
    """Temp and partial files of any writer under `root`."""
    markers = (".tmp", ".part.tif", ".partial", ".probe")
    return sorted(
        str(p) for p in root.rglob("*") if p.name.startswith(".") and p.name.endswith(markers)
    )


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


# -- a directory that takes no new files ---------------------------------------------------------


@pytest.mark.parametrize("name", list(WRITERS))
def test_an_unwritable_output_directory_is_one_line_before_any_work(
    name: str, inputs: Inputs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    quick_runs(name, monkeypatch)
    spare = tmp_path / "spare"
    args, target = WRITERS[name](inputs, Path("/proc/landcover-test"), spare)
    result = invoke(*args)
    message = assert_one_line_error(result, str(target))
    assert "/proc" in message and ("cannot create" in message or "choose another" in message)
    assert not spare.exists()  # the other outputs were not written either


# -- a full disk ----------------------------------------------------------------------------------


@pytest.fixture()
def disk_full(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """`disk_full(path)`: putting any file in place at or under `path` fails with ENOSPC, as a
    full file system refuses the last write of a file (the temp file's name in the error, as
    the kernel reports it)."""
    real_replace, real_link = os.replace, os.link

    def arm(full: Path) -> None:
        def refuse(real: Callable[..., None]) -> Callable[..., None]:
            def put(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                if Path(os.fspath(dst)).absolute().is_relative_to(full):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(src))
                real(src, dst, *args, **kwargs)

            return put

        monkeypatch.setattr(os, "replace", refuse(real_replace))
        monkeypatch.setattr(os, "link", refuse(real_link))

    return arm


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_full_disk_is_one_line_naming_the_output_and_leaves_no_half_output(
    name: str,
    inputs: Inputs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    disk_full: Callable[[Path], None],
) -> None:
    quick_runs(name, monkeypatch)
    out, spare = tmp_path / "out", tmp_path / "spare"
    out.mkdir()
    args, target = WRITERS[name](inputs, out, spare)
    disk_full(out)
    result = invoke(*args)
    assert_one_line_error(result, str(target), "No space left on device")
    assert leftovers(tmp_path) == []
    if target.suffix in (".tif", ".json", ".torchscript"):  # one file: not there at all
        assert not os.path.lexists(target)


# -- a file that appears meanwhile, a user's symlink -----------------------------------------------

# Commands whose output the user names, replaced only with --overwrite: (writer, the file of
# the output that the test puts in the way).
NAMED_OUTPUTS: dict[str, tuple[Writer, str]] = {
    "export": (_export, ""),
    "predict --out": (_predict, ""),
    "predict --probabilities": (_predict_probabilities, ""),
    "predict --stac-item": (_predict_stac_item, ""),
    "evaluate": (_evaluate, "metrics.json"),
    "evaluate --reference": (_evaluate_reference, "report.html"),
    "sample .csv": (_sample, ""),
    "sample .gpkg": (lambda i, out, spare: _sample(i, out, spare, suffix=".gpkg"), ""),
    "change": (_change, "change.tif"),
    "report scaling": (_report_scaling, "report.md"),
    "cluster plan": (_cluster_plan, "plan.txt"),
}


@pytest.fixture()
def appears_when_put(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], None]:
    """`appears_when_put(path)`: a user's file is created at `path` just before a writer puts
    its file there, after every check the command made."""
    real_replace, real_link = os.replace, os.link

    def arm(path: Path) -> None:
        def first_the_user(real: Callable[..., None]) -> Callable[..., None]:
            def put(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                if Path(os.fspath(dst)) == path and not os.path.lexists(path):
                    path.write_text(USER_TEXT)
                real(src, dst, *args, **kwargs)

            return put

        monkeypatch.setattr(os, "replace", first_the_user(real_replace))
        monkeypatch.setattr(os, "link", first_the_user(real_link))

    return arm


@pytest.mark.parametrize("name", list(NAMED_OUTPUTS))
def test_a_file_that_appears_after_the_check_is_never_replaced(
    name: str, inputs: Inputs, tmp_path: Path, appears_when_put: Callable[[Path], None]
) -> None:
    writer, inner = NAMED_OUTPUTS[name]
    args, target = writer(inputs, tmp_path / "out", tmp_path / "spare")
    path = target / inner if inner else target
    appears_when_put(path)
    result = invoke(*args)
    assert_one_line_error(result, f"{path} exists; pass --overwrite")
    assert path.read_text() == USER_TEXT
    assert leftovers(tmp_path) == []


SYMLINKED: dict[str, tuple[Writer, str]] = {
    **NAMED_OUTPUTS,
    "train": (_train, "model.pt"),
    "synth": (_synth, "naip/m_3807613_nw_18_100_20180606.tif"),
}


@pytest.mark.parametrize("dangling", [False, True], ids=["to a file", "dangling"])
@pytest.mark.parametrize("name", list(SYMLINKED))
def test_a_users_symlink_at_an_output_is_kept_without_overwrite(
    name: str, dangling: bool, inputs: Inputs, tmp_path: Path
) -> None:
    writer, inner = SYMLINKED[name]
    args, target = writer(inputs, tmp_path / "out", tmp_path / "spare")
    link = target / inner if inner else target
    if name == "synth":  # the name synth gives its one scene
        listed = invoke("synth", str(tmp_path / "probe"), "--scenes", "1", "--size", "64")
        assert listed.exit_code == 0, listed.output
        link = target / "naip" / next((tmp_path / "probe" / "naip").glob("*.tif")).name
    users = tmp_path / "users.txt"
    if not dangling:
        users.write_text(USER_TEXT)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(users)
    result = invoke(*args)
    message = assert_one_line_error(result, str(link.parent if name == "train" else link))
    assert "--overwrite" in message or "symbolic link" in message
    assert link.is_symlink() and os.readlink(link) == str(users)
    assert users.read_text() == USER_TEXT if not dangling else not users.exists()


# -- distinct outputs -----------------------------------------------------------------------------


def _same_file_spellings(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(first, second, kind) spellings of one file."""
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "o.tif", tmp_path / "elsewhere" / "link.tif")
    yield str(tmp_path / "o.tif"), str(tmp_path / "o.tif"), "same"
    yield str(tmp_path / "o.tif"), f"{tmp_path}/./o.tif", "dot"
    yield str(tmp_path / "o.tif"), str(tmp_path / "elsewhere" / "link.tif"), "symlink"


OUTPUT_PAIRS = [
    ("--out", "--probabilities"),
    ("--out", "--stac-item"),
    ("--probabilities", "--stac-item"),
]


@pytest.mark.parametrize("command", ["predict", "cluster plan", "cluster launch"])
@pytest.mark.parametrize(("first", "second"), OUTPUT_PAIRS)
def test_two_outputs_at_one_file_are_refused_before_any_work(
    command: str, first: str, second: str, inputs: Inputs, tmp_path: Path
) -> None:
    for a, b, _ in _same_file_spellings(tmp_path):
        options = {"--out": str(tmp_path / "lc.tif"), first: a, second: b}
        predict = ["predict", str(tmp_path / "no-model.pt"), str(inputs.scene), "--overwrite"]
        predict += [token for option, value in options.items() for token in (option, value)]
        if command == "predict":
            args = predict
        else:
            args = ["cluster", command.split()[1], str(inputs.cluster_json), "--", *predict]
        result = invoke(*args)
        # the model does not exist: the outputs are refused first
        assert_one_line_error(result, f"{first} {a} and {second} {b} are the same file")
        assert not (tmp_path / "o.tif").exists() and not (tmp_path / "lc.tif").exists()


@pytest.mark.parametrize("command", ["predict", "export"])
def test_an_output_at_an_input_is_refused_even_with_overwrite(
    command: str, inputs: Inputs, tmp_path: Path
) -> None:
    model = tmp_path / "model.pt"
    model.write_bytes(inputs.model.read_bytes())
    scene = tmp_path / "scene.tif"
    scene.write_bytes(inputs.scene.read_bytes())
    if command == "predict":
        args = ["predict", str(model), str(scene), "--out", f"{tmp_path}/./scene.tif"]
        kept, what = scene, "image"
    else:
        args = ["export", str(model), "--format", "torchscript", "--out", str(model)]
        kept, what = model, "model"
    before = kept.read_bytes()
    result = invoke(*args, "--overwrite")
    assert_one_line_error(result, f"is the {what} {kept}")
    assert kept.read_bytes() == before


# -- a plan directory overwritten ------------------------------------------------------------------


def test_overwriting_a_plan_for_another_engine_leaves_only_the_new_plans_files(
    inputs: Inputs, tmp_path: Path
) -> None:
    # without an image, the plan writes the build context environment/ too
    azureml_section = {k: v for k, v in AZUREML_SPEC["azureml"].items() if k != "image"}
    azureml = tmp_path / "azureml.json"
    azureml.write_text(json.dumps({**AZUREML_SPEC, "azureml": azureml_section}))
    plan_dir = tmp_path / "plan"
    store = "https://landcoverdata.blob.core.windows.net/chips/naip.zarr"
    train = ["--", "train", store, "--out", "/shared/run", "--epochs", "2"]
    first = invoke("cluster", "plan", str(azureml), "--out", str(plan_dir), *train)
    assert first.exit_code == 0, first.output
    assert {"job.yaml", "compute.yaml", "environment/Dockerfile"} <= set(files_under(plan_dir))
    (plan_dir / "notes.md").write_text(USER_TEXT)  # the user's, beside the plan
    (plan_dir / "environment" / "mine.txt").write_text(USER_TEXT)

    args = ["cluster", "plan", str(inputs.cluster_json), "--out", str(plan_dir), *train]
    refused = invoke(*args)
    assert_one_line_error(refused, f"{plan_dir / 'plan.txt'} exists; pass --overwrite")
    second = invoke(*args[:5], "--overwrite", *args[5:])
    assert second.exit_code == 0, second.output
    # no job.yaml left for `az ml job create -f` to submit; nothing of the user's removed
    assert files_under(plan_dir) == ["environment/mine.txt", "notes.md", "plan.txt", "torchrun.sh"]
    assert (plan_dir / "notes.md").read_text() == USER_TEXT


# -- a directory output holds one product ----------------------------------------------------


def _evaluate_no_panels(i: Inputs, out: Path, spare: Path) -> Args:
    args, target = _evaluate(i, out, spare)
    return [*args, "--no-panels"], target


def _at(writer: Writer, target: Path) -> Writer:
    """`writer` with its output directory at `target`."""

    def at(i: Inputs, out: Path, spare: Path) -> Args:
        args, own = writer(i, out, spare)
        return [str(target) if a == str(own) else a for a in args], target

    return at


def _report_scaling_of_another_device(i: Inputs, out: Path, spare: Path) -> Args:
    runs = spare / "gpu-runs"
    if not runs.exists():
        write_run(runs, "workers-1", workers=1, epoch_times=[9.0, 8.0], device="NVIDIA H100")
    target = out / "report"
    return ["report", "scaling", str(runs), "--out", str(target)], target


# Each directory output, and a product of the same command that it replaces under --overwrite:
# a truth-mode report with panels by one without and by a sample-mode report, a scaling
# report of another device's runs (other figures), a change by a change.
DIRECTORY_OUTPUTS: dict[str, tuple[Writer, Writer]] = {
    "evaluate": (_evaluate_no_panels, _evaluate),
    "evaluate --reference": (_evaluate_reference, _evaluate),
    "report scaling": (_report_scaling, _report_scaling_of_another_device),
    "change": (_change, _change),
}


@pytest.mark.parametrize("name", list(DIRECTORY_OUTPUTS))
def test_a_directory_output_holds_one_product(inputs: Inputs, tmp_path: Path, name: str) -> None:
    """A user's file in the directory is refused in one line without --overwrite and kept;
    with --overwrite nothing of the product that was there remains (before: evaluate wrote
    beside any file, and a sample-mode report left a truth-mode report's panel-NN.png)."""
    writer, other = DIRECTORY_OUTPUTS[name]
    spare = tmp_path / "spare"
    fresh_args, fresh = writer(inputs, tmp_path / "fresh", spare)
    made = invoke(*fresh_args)
    assert made.exit_code == 0, made.output
    args, target = writer(inputs, tmp_path / "out", spare)

    target.mkdir(parents=True)
    (target / "notes.md").write_text(USER_TEXT)
    refused = invoke(*args)
    assert_one_line_error(refused, str(target / "notes.md"), "--overwrite")
    assert files_under(target) == ["notes.md"]
    assert (target / "notes.md").read_text() == USER_TEXT

    (target / "notes.md").unlink()
    old_args, _ = _at(other, target)(inputs, tmp_path / "old", spare)
    old = invoke(*old_args)
    assert old.exit_code == 0, old.output
    (target / "notes.md").write_text(USER_TEXT)
    replaced = invoke(*args, "--overwrite")
    assert replaced.exit_code == 0, replaced.output
    visible = [f for f in files_under(target) if not Path(f).name.startswith(".")]
    expected = [f for f in files_under(fresh) if not Path(f).name.startswith(".")]
    assert visible == sorted([*expected, "notes.md"])
    assert (target / "notes.md").read_text() == USER_TEXT


# -- a writer killed outright ---------------------------------------------------------------

_KILLED_WHILE_WRITING = """
import os, signal, sys
from tiling.runtime import atomic
def killed(*args, **kwargs):  # the temp file is written, not yet in place
    os.kill(os.getpid(), signal.SIGKILL)
atomic._finish = killed
from landcover.cli.app import main
sys.argv = ["landcover", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("name", ["sample .csv", "sample .gpkg", "evaluate --reference"])
def test_a_rerun_removes_the_temp_files_of_a_killed_writer(
    inputs: Inputs, tmp_path: Path, name: str
) -> None:
    """A real SIGKILL while the output's temp file is written leaves it (nothing can remove
    it then); the rerun of the command removes it (before: hidden temp files stayed for ever)."""
    out = tmp_path / "out"
    args, target = WRITERS[name](inputs, out, tmp_path / "spare")
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_WRITING, *args],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert leftovers(out), files_under(out)  # what the kill left
    rerun = invoke(*args, "--overwrite")
    assert rerun.exit_code == 0, rerun.output
    assert target.exists()
    assert leftovers(out) == []
