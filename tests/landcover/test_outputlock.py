"""One run at a time into one output (landcover.outputlock): a second run is refused at once in
one line naming the holder's pid, for every command that stages parts or writes a directory
(predict, with and without --nproc; train, with and without --nproc; tune), and a lock that a
killed run left behind never blocks the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from landcover.cli.app import main
from landcover.errors import OutputBusyError
from landcover.outputlock import exclusive_outputs, exclusive_writer, lock_path_for
from landcover.tuning.studydir import exclusive as tune_exclusive
from tests.landcover.prediction.inputs import pixels, write_image, write_model


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    out = tmp_path / "lc.tif"
    with exclusive_outputs([str(out)], "predict"):
        with pytest.raises(OutputBusyError) as caught, exclusive_outputs([str(out)], "predict"):
            pass
        assert str(caught.value) == (
            f"another predict is writing {out} (pid {os.getpid()}); wait for it or choose "
            "another --out"
        )
    assert list(tmp_path.iterdir()) == []  # the lock file goes with its holder
    with exclusive_outputs([str(out)], "predict"):  # and the next run takes it
        pass


def test_a_lock_a_killed_run_left_behind_does_not_block(tmp_path: Path) -> None:
    """kill -9 runs no clean-up: the lock file stays, with the dead run's pid, but the kernel
    released the flock with the process, so the next run takes it over."""
    out = tmp_path / "deep" / "lc.tif"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from landcover.outputlock import exclusive_outputs as x\n"
            f"with x([{str(out)!r}], 'predict'):\n"
            "    print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        busy = rf"\(pid {holder.pid}\); wait for it"
        with pytest.raises(OutputBusyError, match=busy), exclusive_outputs([str(out)], "predict"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    lock = lock_path_for(str(out))
    assert str(holder.pid) in lock.read_text()  # left behind
    with exclusive_outputs([str(out)], "predict"):
        assert str(os.getpid()) in lock.read_text()
    assert not lock.exists()


def test_a_lock_for_a_url_is_a_local_file_named_by_the_url() -> None:
    first, second = lock_path_for("az://c/a/lc.tif"), lock_path_for("az://c/b/lc.tif")
    assert first != second and first.parent == second.parent
    assert lock_path_for("az://c/a/lc.tif") == first
    assert lock_path_for("runs/a/").name == "a.lock"


def test_a_urls_lock_is_in_this_users_folder_whatever_another_user_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock folder of URL outputs is per user: a shared one, made by the first user with
    a umask that shuts others out (here: a file in its place), blocked everyone else."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "landcover-locks").write_text("another user's")
    lock = lock_path_for("az://c/a/lc.tif")
    assert lock.parent == tmp_path / f"landcover-locks-{os.getuid()}"
    with exclusive_outputs(["az://c/a/lc.tif"], "predict"):
        assert str(os.getpid()) in lock.read_text()
    assert not lock.exists()


def test_a_lock_file_that_stays_keeps_the_next_holders_pid(tmp_path: Path) -> None:
    lock = tmp_path / ".tune.lock"
    with exclusive_writer(lock, "busy", remove=False):
        pass
    assert lock.exists()
    with (
        pytest.raises(OutputBusyError, match=rf"^busy \(pid {os.getpid()}\)"),
        exclusive_writer(lock, "busy", remove=False),
        exclusive_writer(lock, "busy"),
    ):
        pass


# -- every command that writes a staging area or a directory ---------------------------------

Held = Callable[[Path], AbstractContextManager[None]]


@pytest.fixture(scope="module")
def predict_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("predict-inputs")
    scene = write_image(folder / "scene.tif", pixels(40, 45, seed=1))
    return write_model(folder / "model.pt", seed=7), scene


def predict_args(inputs: tuple[Path, Path], out: Path) -> list[str]:
    model, scene = inputs
    return ["predict", str(model), str(scene), "--out", str(out), "--device", "cpu"]


def train_args(store: str, out: Path) -> list[str]:
    return ["train", store, "--out", str(out), "--epochs", "1", "--tracking", "none"]


def tune_args(store: str, out: Path) -> list[str]:
    space = ["--space", "lr=1e-3:1e-2"]
    return ["tune", store, *space, "--epochs", "1", "--trials", "1", "--out", str(out)]


# (command line, the lock a running one holds, the first words of the refusal)
COMMANDS: dict[str, tuple[Callable[..., list[str]], Held, str]] = {
    "predict": (
        lambda inputs, store, out: predict_args(inputs, out),
        lambda out: exclusive_outputs([str(out)], "predict"),
        "another predict is writing",
    ),
    "predict --nproc 2": (
        lambda inputs, store, out: [*predict_args(inputs, out), "--nproc", "2"],
        lambda out: exclusive_outputs([str(out)], "predict"),
        "another predict is writing",
    ),
    "train": (
        lambda inputs, store, out: train_args(store, out),
        lambda out: exclusive_outputs([str(out)], "train"),
        "another train is writing",
    ),
    "train --nproc 2": (
        lambda inputs, store, out: [*train_args(store, out), "--nproc", "2"],
        lambda out: exclusive_outputs([str(out)], "train"),
        "another train is writing",
    ),
    "tune": (
        lambda inputs, store, out: tune_args(store, out),
        lambda out: tune_exclusive(out),
        "another landcover tune is using",
    ),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_second_run_into_one_output_is_refused_at_once(
    command: str, predict_inputs: tuple[Path, Path], tiny_store: str, tmp_path: Path
) -> None:
    """A run of `command` holds its output; a second one into the same --out (ranks or
    workers included) is one line and exit 2 before any work, and leaves the output alone."""
    args, held, refusal = COMMANDS[command]
    out = tmp_path / ("tune" if command == "tune" else "out")
    if command == "tune":
        out.mkdir()  # a running search made it
    with held(out):
        before = sorted(p.name for p in tmp_path.rglob("*"))
        result = CliRunner().invoke(main, args(predict_inputs, tiny_store, out))
        after = sorted(p.name for p in tmp_path.rglob("*"))
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[-1] == (
        f"error: {refusal} {out} (pid {os.getpid()}); wait for it or choose another --out"
    )
    assert after == before
