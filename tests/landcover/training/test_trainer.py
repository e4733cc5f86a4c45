"""The trainer: one worker in-process, two gloo workers (spawn and torchrun), resume, outputs."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from click.testing import CliRunner
from torch import nn

from landcover import cli
from landcover.errors import TrainingError
from landcover.models.modelfile import load_model_file
from landcover.models.registry import build_model
from landcover.training import (
    TrainCallbacks,
    read_metrics,
    train,
    warmup_cosine,
)
from landcover.training import checkpoint as checkpoint_file
from landcover.training.distributed import DistEnv
from landcover.training.losses import Scores
from landcover.training.records import RUN_KEYS
from tests.multiprocess import free_ports
from tests.support.trainruns import make_config
from tiling.chipstore.store import open_store
from tiling.runtime.machine import local_cpu_count
from tiling.synthetic.scenes import SynthResult
from tiling.tiler.tile import TileConfig, tile

METRIC_FIELDS = [
    "epoch", "world_size", "nodes", "epoch_time_s", "load_time_s", "val_time_s", "train_loss",
    "val_loss", "val_miou", "val_accuracy", "per_class_iou", "samples_per_s", "pixels_per_s",
    "step_time_s", "data_time_s", "steps", "comm_bytes_per_step", "comm_time_s", "compression",
    "block_momentum", "model", "batch_size", "device", "threads_per_worker", "host", "lr", "time",
]  # fmt: skip


def checkpoint(run: Path) -> dict[str, Any]:
    payload = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    assert isinstance(payload, dict)
    return payload


# Measurements inside saved state that no two processes share: wall-clock time, and the count
# of collectives and buckets, since DDP rebuilds its buckets after the first step of every
# process (a resumed run's epoch has one step with the first layout). Payload bytes are equal.
TIMINGS = frozenset({"comm_time_s", "calls", "buckets"})


def assert_same_tensors(a: Any, b: Any, where: str = "") -> None:
    """Bitwise equality of nested dicts/lists of tensors and plain values (timings aside)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, Mapping):
        assert set(a) == set(b), where
        for key in set(a) - TIMINGS:
            assert_same_tensors(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tensors(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def assert_metric_lines(run: Path, *, epochs: int, world_size: int) -> list[dict[str, Any]]:
    lines = read_metrics(run)
    assert [m["epoch"] for m in lines] == list(range(1, epochs + 1))
    for m in lines:
        missing = [f for f in METRIC_FIELDS if f not in m]
        assert not missing, missing
        assert m["world_size"] == world_size and m["nodes"] == 1
        assert m["per_class_iou"][0] is None and len(m["per_class_iou"]) == 5
        assert 0.0 <= m["val_miou"] <= 1.0 and 0.0 <= m["val_accuracy"] <= 1.0
        assert m["epoch_time_s"] > 0 and m["step_time_s"] > m["data_time_s"] > 0
        assert m["samples_per_s"] == pytest.approx(
            m["steps"] * m["batch_size"] * world_size / m["epoch_time_s"]
        )
        assert m["pixels_per_s"] == pytest.approx(m["samples_per_s"] * 64 * 64)
        assert m["device"].startswith("cpu: ") and m["time"].endswith("+00:00")
    return lines


class KilledError(Exception):
    """Raised by a test callback to stop a run after a checkpoint, like a killed job."""


def interrupt_after(epoch_to_stop: int) -> TrainCallbacks:
    def on_epoch_end(epoch: int, record: Mapping[str, Any]) -> None:
        if epoch == epoch_to_stop:
            raise KilledError

    return TrainCallbacks(on_epoch_end=on_epoch_end)


# -- pieces -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"epochs": 0}, "--epochs 0 must be >= 1"),
        ({"batch_size": 0}, "--batch-size 0 must be >= 1"),
        ({"optimizer": "lbfgs"}, "--optimizer 'lbfgs': use one of"),
        ({"resume": True, "overwrite": True}, "--resume and --overwrite exclude each other"),
        ({"block_momentum": True, "compression": "fp16"}, "use one of them"),
        ({"block_momentum_value": 1.0}, "--block-momentum-value 1.0 must be in \\[0, 1\\)"),
        ({"block_momentum": True, "sync_bn": True}, "--sync-bn all-reduces BatchNorm statistics"),
    ],
)
def test_bad_configs_are_named(overrides: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=message):
        make_config("store.zarr", tmp_path, **overrides)


def test_warm_up_then_cosine_decay() -> None:
    values = [warmup_cosine(s, warmup_steps=4, total_steps=20) for s in range(20)]
    assert values[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert values[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(values[4:]))
    assert values[-1] == pytest.approx(0.01, abs=0.01)


def test_training_refuses_a_shard_that_does_not_fit(
    tiny_store: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("landcover.training.builders.available_memory_bytes", lambda: 200_000)
    with pytest.raises(TrainingError, match=r"use at least \d+ workers in total"):
        train(make_config(tiny_store, run_dir))
    assert not (run_dir / "metrics.jsonl").exists()


# -- one worker, in this process ----------------------------------------------------------------


@pytest.mark.slow
def test_one_worker_run_outputs_and_exact_resume(tiny_store: str, tmp_path: Path) -> None:
    """Uninterrupted 2 epochs vs. interrupted after epoch 1 + `--resume`: same bits."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    epoch_end_states: dict[int, dict[str, torch.Tensor]] = {}

    def keep_state(epoch: int, step: int, model: nn.Module) -> None:
        epoch_end_states[epoch] = {k: v.clone() for k, v in model.state_dict().items()}

    result = train(make_config(tiny_store, whole), callbacks=TrainCallbacks(on_step=keep_state))
    assert result.epochs_completed == 2 and not result.stopped_early
    lines = assert_metric_lines(whole, epochs=2, world_size=1)
    assert lines[0]["comm_bytes_per_step"] == 0 and lines[0]["compression"] == "none"

    # --resume with nothing to resume starts fresh (what elastic restarts rely on).
    with pytest.raises(KilledError):
        train(make_config(tiny_store, broken, resume=True), callbacks=interrupt_after(1))
    assert [m["epoch"] for m in read_metrics(broken)] == [1]
    resumed = train(make_config(tiny_store, broken, resume=True))
    assert resumed.epochs_completed == 2
    a, b = checkpoint(whole), checkpoint(broken)
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] == 2 * lines[0]["steps"]
    for x, y in zip(lines, read_metrics(broken), strict=True):
        assert (x["train_loss"], x["val_miou"]) == (y["train_loss"], y["val_miou"])

    run = json.loads((whole / "run.json").read_text())
    assert set(RUN_KEYS) <= set(run) and run["cores"] == local_cpu_count()
    assert run["world_size"] == 1 and run["config"]["batch_size"] == 8
    assert run["store"]["summary"]["chip_size"] == 64 and run["versions"]["torch"]
    assert run["device"].startswith("cpu: ")

    # model.pt is the best epoch's model, self-describing, and predicts like the trained one.
    model, meta = load_model_file(whole / "model.pt")
    summary = open_store(tiny_store).summary
    assert meta.architecture == "small_unet" and meta.chip_size == 64
    assert meta.band_mean == pytest.approx(summary.band_mean)
    assert meta.class_map == summary.class_map
    assert meta.training["epoch"] == result.best_epoch
    trained = build_model("small_unet", num_classes=5)
    trained.load_state_dict(epoch_end_states[result.best_epoch])
    assert_same_tensors(epoch_end_states[2], a["model"], "last epoch")
    images = torch.randn(2, 4, 64, 64)
    with torch.no_grad():
        assert torch.equal(model(images), trained.eval()(images))


@pytest.mark.slow
def test_learning_check(tiny_store: str, run_dir: Path) -> None:
    """small_unet reaches val mIoU >= 0.55 within 6 epochs on the tiny synthetic store.

    2 synthetic scenes of 448 px, 64 px chips (69 train / 28 val chips), batch 8, one worker,
    default AdamW + warm-up/cosine schedule. Observed best-of-6-epochs val mIoU 0.62-0.73
    over seeds 0-3 (0.63 for seed 0); an untrained model scores 0.05-0.4 after one epoch.
    """
    result = train(make_config(tiny_store, run_dir, epochs=6))
    assert result.best_val_miou >= 0.55, read_metrics(run_dir)
    lines = read_metrics(run_dir)
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]


@pytest.mark.slow
def test_resume_drops_the_metrics_line_of_an_epoch_without_checkpoint(
    tiny_store: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed after epoch 2's metrics line but before its checkpoint: the resumed run
    repeats epoch 2 and metrics.jsonl holds it once."""
    save_checkpoint = checkpoint_file.save_checkpoint

    def killed_before_epoch_2_checkpoint(out: Path, payload: Mapping[str, Any]) -> None:
        if payload["epoch"] == 2:
            raise KilledError
        save_checkpoint(out, payload)

    monkeypatch.setattr(
        "landcover.training.trainer.save_checkpoint", killed_before_epoch_2_checkpoint
    )
    with pytest.raises(KilledError):
        train(make_config(tiny_store, run_dir, augment=False))
    killed = read_metrics(run_dir)
    assert [m["epoch"] for m in killed] == [1, 2] and checkpoint(run_dir)["epoch"] == 1
    monkeypatch.undo()
    result = train(make_config(tiny_store, run_dir, augment=False, resume=True))
    lines = read_metrics(run_dir)
    assert [m["epoch"] for m in lines] == [1, 2] and result.epochs_completed == 2
    assert lines[1]["train_loss"] == killed[1]["train_loss"]  # the same epoch 2, run again


@pytest.mark.slow
def test_early_stop_on_val_miou(
    tiny_store: str, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flat = Scores(miou=0.5, accuracy=0.5, per_class_iou=[None, 0.5, 0.5, 0.5, 0.5])
    monkeypatch.setattr("landcover.training.trainer.scores_from_confusion", lambda cm: flat)
    result = train(make_config(tiny_store, run_dir, epochs=5, patience=2))
    assert result.stopped_early and result.epochs_completed == 3 and result.best_epoch == 1
    assert [m["epoch"] for m in read_metrics(run_dir)] == [1, 2, 3]
    # An elastic restart of a run that stopped early has nothing left to do.
    again = train(make_config(tiny_store, run_dir, epochs=5, patience=2, resume=True))
    assert again.stopped_early and again.epochs_completed == 3
    assert [m["epoch"] for m in read_metrics(run_dir)] == [1, 2, 3]


def test_cli_trains_in_process_then_refuses_to_overwrite(tiny_store: str, run_dir: Path) -> None:
    args = ["train", tiny_store, "--out", str(run_dir), "--epochs", "1", "--batch-size", "8",
            "--threads", "1", "--device", "cpu"]  # fmt: skip
    # Local paths take no storage options: refused before any work, the key not shown.
    storage = ["--storage-options", '{"account_name": "acct", "account_key": "s3cret"}']
    refused = CliRunner().invoke(cli.main, [*args, *storage])
    assert refused.exit_code == 2
    assert "--storage-options (account_key, account_name) do not apply to local paths" in (
        refused.output
    )
    assert "s3cret" not in refused.output and not run_dir.exists()
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert "1 epochs, best val mIoU" in result.output
    again = CliRunner().invoke(cli.main, args)
    assert again.exit_code == 2
    assert "already holds a training run (metrics.jsonl, run.json, model.pt, checkpoints); " in (
        again.output
    )
    assert again.output.strip().endswith(
        "pass --resume to continue it or --overwrite to replace it"
    )


# -- stores without val chips, resuming onto another store, --sync-bn --------------------------


@pytest.fixture(scope="module")
def no_val_store(tiny_scenes: SynthResult, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One tiny scene tiled without a val split: 49 train chips of 64 px, no val chips."""
    url = str(tmp_path_factory.mktemp("no-val-store") / "chips.zarr")
    tile(
        TileConfig(
            images=(str(tiny_scenes.image_paths[0]),),
            labels=(str(tiny_scenes.label_paths[0]),),
            out=url,
            chip_size=64,
            shard_size=16,
            val_fraction=0.0,
            workers=1,
        )
    )
    return url


@pytest.mark.slow
def test_a_store_without_val_chips_trains_and_keeps_the_last_epoch(
    no_val_store: str, run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    summary = open_store(no_val_store).summary
    assert summary.num_val == 0 and summary.num_train > 8
    with caplog.at_level(logging.WARNING, logger="landcover.training"):
        result = train(make_config(no_val_store, run_dir))
    warnings = [r.getMessage() for r in caplog.records if r.name == "landcover.training.builders"]
    assert warnings == [
        f"{no_val_store} has no val chips: validation is skipped and model.pt is the last "
        "epoch's model; re-tile with --val-fraction > 0 to validate"
    ]
    assert result.epochs_completed == 2 and result.best_epoch == 2
    assert math.isnan(result.best_val_miou)
    lines = read_metrics(run_dir)
    assert [(m["val_miou"], m["val_loss"], m["per_class_iou"]) for m in lines] == [
        (None, None, [None] * 5)
    ] * 2
    model, meta = load_model_file(run_dir / "model.pt")
    assert meta.training["epoch"] == 2
    assert_same_tensors(model.state_dict(), checkpoint(run_dir)["model"], "model.pt")


def test_patience_without_val_chips_is_one_line_before_training(
    no_val_store: str, run_dir: Path
) -> None:
    args = ["train", no_val_store, "--out", str(run_dir), "--patience", "2", "--epochs", "3",
            "--threads", "1", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --patience 2 stops on val mIoU but {no_val_store} has no val chips; drop "
        "--patience, or re-tile with --val-fraction > 0"
    ]
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_resume_refuses_another_store_and_accepts_a_moved_one(
    no_val_store: str, tiny_store: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    train(make_config(no_val_store, run, epochs=1))
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    other = open_store(tiny_store).summary
    with pytest.raises(TrainingError) as info:
        train(make_config(tiny_store, run, epochs=2, resume=True))
    assert str(info.value) == (
        f"{last}: checkpoint was trained on the store {no_val_store} (49 chips, 0 val) but "
        f"{tiny_store} holds other chips ({other.num_chips}, {other.num_val} val); pass "
        "--overwrite to replace this run, or train into a new --out"
    )
    assert last.read_bytes() == before and len(read_metrics(run)) == 1
    # The same store under another URL (copied from blob storage to a local disk, say).
    moved = tmp_path / "moved.zarr"
    shutil.copytree(no_val_store, moved)
    with caplog.at_level(logging.WARNING, logger="landcover.training.resume"):
        result = train(make_config(str(moved), run, epochs=2, resume=True))
    assert result.epochs_completed == 2
    assert f"checkpoint was trained on {no_val_store}; resuming on {moved}" in caplog.text


def test_sync_bn_on_cpu_workers_is_refused_before_joining(tiny_store: str, run_dir: Path) -> None:
    """torch's SyncBatchNorm only runs on accelerators: the option names the way out."""
    env = DistEnv(rank=0, world_size=2, local_rank=0, local_world_size=2,
                  master_addr="127.0.0.1", master_port=free_ports(1)[0])  # fmt: skip
    with pytest.raises(TrainingError) as info:
        train(make_config(tiny_store, run_dir, sync_bn=True), dist_env=env)
    message = str(info.value)
    assert message.startswith("--sync-bn needs CUDA devices (torch 2.")
    assert message.endswith(
        "SyncBatchNorm does not run on CPU); drop --sync-bn (BatchNorm statistics are averaged "
        "over the workers after every epoch anyway) or use --device cuda"
    )
    assert not run_dir.exists()


# -- two gloo workers ---------------------------------------------------------------------------


def _set_launcher_env(rank: int, port: int) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip


def _check_replicas(epoch: int, step: int, model: nn.Module) -> None:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    copies = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(copies, flat)
    assert torch.equal(copies[0], copies[1]), f"replicas differ after epoch {epoch} step {step}"


def float_buffers(model: nn.Module) -> torch.Tensor:
    """BatchNorm's running statistics, flattened in module order."""
    return torch.cat([b.detach().reshape(-1) for b in model.buffers() if b.is_floating_point()])


def _whole_and_resumed_worker(
    rank: int, ports: list[int], store: str, root: str, extra: dict[str, Any]
) -> None:
    """Train 2 epochs; then again, killed after epoch 1 and resumed (3 process groups).
    The killed run leaves a copy of its epoch-1 outputs in ROOT/epoch1."""
    whole, broken = Path(root) / "whole", Path(root) / "broken"
    # The first run reads the launcher variables, as under torchrun; the others get a DistEnv.
    _set_launcher_env(rank, ports[0])
    batchnorm: dict[int, torch.Tensor] = {}  # epoch -> this rank's statistics at its last step

    def check(epoch: int, step: int, model: nn.Module) -> None:
        if not extra.get("block_momentum"):
            _check_replicas(epoch, step, model)
        batchnorm[epoch] = float_buffers(model)

    train(make_config(store, whole, **extra), callbacks=TrainCallbacks(on_step=check))
    torch.save(batchnorm, Path(root) / f"batchnorm-rank{rank}.pt")

    def env(port: int) -> DistEnv:
        return DistEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2,
                       master_addr="127.0.0.1", master_port=port)  # fmt: skip

    def keep_epoch_1_then_die(epoch: int, record: Mapping[str, Any]) -> None:
        if rank == 0:
            (Path(root) / "epoch1").mkdir()
            for name in ("model.pt", "checkpoints/last.pt"):
                shutil.copy(broken / name, Path(root) / "epoch1")
        raise KilledError

    try:
        train(make_config(store, broken, **extra), dist_env=env(ports[1]),
              callbacks=TrainCallbacks(on_epoch_end=keep_epoch_1_then_die))  # fmt: skip
        raise AssertionError("the run was not interrupted")
    except KilledError:
        pass
    train(make_config(store, broken, resume=True, **extra), dist_env=env(ports[2]))


TWO_WORKER_MODES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "bmuf": {"block_momentum": True, "block_size": 3},  # 4 steps per epoch: ends mid-block
}


@pytest.fixture(scope="module")
def two_worker_runs(
    tiny_store: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """Mode name -> the root of `_whole_and_resumed_worker`'s runs, run once per module."""
    roots: dict[str, Path] = {}

    def run(mode: str) -> Path:
        if mode not in roots:
            root = tmp_path_factory.mktemp(f"two-workers-{mode}")
            mp.spawn(  # type: ignore[attr-defined,no-untyped-call]
                _whole_and_resumed_worker,
                args=(free_ports(3), tiny_store, str(root), TWO_WORKER_MODES[mode]),
                nprocs=2,
                join=True,
            )
            roots[mode] = root
        return roots[mode]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(TWO_WORKER_MODES))
def test_two_workers_train_in_step_and_resume_exactly(
    mode: str, two_worker_runs: Callable[[str], Path]
) -> None:
    """DDP: parameters identical on both ranks after every step. Both modes: a run killed
    after epoch 1 and resumed ends bitwise equal to an uninterrupted one, per-rank state
    included (comm meters; BMUF's local models, which differ between block syncs)."""
    root = two_worker_runs(mode)
    lines = assert_metric_lines(root / "whole", epochs=2, world_size=2)
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]
    assert lines[0]["threads_per_worker"] == 1
    assert lines[0]["block_momentum"] == (mode == "bmuf")
    assert lines[0]["compression"] == "none"
    assert lines[0]["comm_bytes_per_step"] > 0 and lines[0]["comm_time_s"] > 0
    if mode == "ddp":  # small_unet's float32 gradients, all-reduced every step
        model, _ = load_model_file(root / "whole" / "model.pt")
        assert lines[0]["comm_bytes_per_step"] == 4 * sum(p.numel() for p in model.parameters())

    a, b = checkpoint(root / "whole"), checkpoint(root / "broken")
    assert_same_tensors(a["model"], b["model"], "model")
    assert_same_tensors(a["optimizer"], b["optimizer"], "optimizer")
    assert len(a["per_rank"]) == 2
    assert_same_tensors(a["per_rank"], b["per_rank"], "per_rank")
    if mode == "bmuf":  # each learner's own model; the block-level state once, for all
        assert {"model", "optimizer"} <= set(a["per_rank"][1])
        assert_same_tensors(a["bmuf"], b["bmuf"], "bmuf")
    else:  # each rank's comm meter
        assert "comm" in a["per_rank"][1] and a["bmuf"] is None
    assert [m["train_loss"] for m in lines] == [
        m["train_loss"] for m in read_metrics(root / "broken")
    ]


def flat_model_state(state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """small_unet's parameters and float buffers, each flattened in module order (BMUF's)."""
    model = build_model("small_unet", num_classes=5)
    model.load_state_dict(state)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    buffers = torch.cat([b.reshape(-1) for b in model.buffers() if b.is_floating_point()])
    return params, buffers


@pytest.mark.slow
def test_bmuf_validates_and_saves_the_global_model(
    two_worker_runs: Callable[[str], Path],
) -> None:
    """Epoch 1 ends mid-block (4 steps, blocks of 3) and the epoch end merges that partial
    block: the learners then agree, and model.pt and the checkpoint's model are BMUF's global
    model (W_global and the BatchNorm statistics of that merge), not rank 0's local model
    (under Nesterov block momentum the learners restart from the look-ahead W_global + η·Δ)."""
    root = two_worker_runs("bmuf")
    saved = torch.load(root / "epoch1" / "last.pt", map_location="cpu", weights_only=True)
    bmuf = saved["bmuf"]
    assert saved["epoch"] == 1 and bmuf["local_steps"] == 4 and bmuf["block_steps"] == 0
    local = [flat_model_state(own["model"]) for own in saved["per_rank"]]
    assert torch.equal(local[0][0], local[1][0])  # the partial block was merged
    model, meta = load_model_file(root / "epoch1" / "model.pt")
    assert meta.training["epoch"] == 1
    for state in (model.state_dict(), saved["model"]):
        params, buffers = flat_model_state(state)
        assert torch.equal(params, bmuf["global_params"])
        assert torch.equal(buffers, bmuf["global_buffers"])
        assert not torch.equal(params, local[0][0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(TWO_WORKER_MODES))
def test_saved_batchnorm_statistics_are_the_mean_over_ranks(
    mode: str, two_worker_runs: Callable[[str], Path]
) -> None:
    """Each rank's BatchNorm statistics follow its own shard; what validation, model.pt and the
    checkpoint use is their mean over the ranks, not rank 0's (DDP broadcast rank 0's: the
    statistics of 1/N of the data)."""
    root = two_worker_runs(mode)
    ranks = [torch.load(root / f"batchnorm-rank{rank}.pt", weights_only=True) for rank in range(2)]
    means = {epoch: (ranks[0][epoch] + ranks[1][epoch]) / 2 for epoch in (1, 2)}
    for epoch in (1, 2):
        assert not torch.equal(ranks[0][epoch], ranks[1][epoch])
    last = checkpoint(root / "whole")
    assert last["epoch"] == 2
    torch.testing.assert_close(flat_model_state(last["model"])[1], means[2], rtol=1e-6, atol=0)
    model, meta = load_model_file(root / "whole" / "model.pt")
    epoch = meta.training["epoch"]
    torch.testing.assert_close(float_buffers(model), means[epoch], rtol=1e-6, atol=0)


def resumable_copy(root: Path, tmp_path: Path) -> Path:
    """A run dir holding only the epoch-1 checkpoint of a two-worker run (killed there)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(root / "epoch1" / "last.pt", run / "checkpoints" / "last.pt")
    return run


@pytest.mark.slow
def test_resume_on_fewer_workers_derives_lr_and_schedule_for_them(
    two_worker_runs: Callable[[str], Path], tiny_store: str, tmp_path: Path
) -> None:
    """A 2-worker run of 2 epochs killed after epoch 1 and resumed on 1 worker (an elastic
    restart) trains at the 1-worker peak lr (base x 1, not the saved base x 2), continues the
    schedule at epoch 2 in its own steps, and its last step's lr is an uninterrupted 1-worker
    run's: 4.8 % of the peak after 8 decay steps (~1 % in longer runs). It was 0.75 x the
    2-worker peak, 1.5 x base: the schedule went on in 2-worker steps from the 2-worker peak."""
    run = resumable_copy(two_worker_runs("ddp"), tmp_path)
    result = train(make_config(tiny_store, run, resume=True))
    assert result.epochs_completed == 2
    lines = read_metrics(run)
    assert [m["world_size"] for m in lines] == [2, 1]
    base_lr = 2e-3  # AdamW's default
    steps = lines[1]["steps"]
    assert steps == open_store(tiny_store).summary.num_train // 8 == 8  # 69 train chips
    last = warmup_cosine(2 * steps - 1, warmup_steps=steps, total_steps=2 * steps)
    assert last == pytest.approx(0.0477, abs=1e-4)
    assert lines[1]["lr"] == pytest.approx(base_lr * last, rel=1e-12)
    info = json.loads((run / "run.json").read_text())
    assert info["world_size"] == 1 and info["peak_lr"] == base_lr
    assert info["total_steps"] == 2 * steps and info["warmup_steps"] == steps
    assert checkpoint(run)["scheduler"]["last_epoch"] == 2 * steps


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(TWO_WORKER_MODES))
def test_resume_refuses_a_change_of_sync_mode(
    mode: str, two_worker_runs: Callable[[str], Path], tiny_store: str, tmp_path: Path
) -> None:
    """A BMUF checkpoint holds one learner per rank; DDP would load them into replicas that
    then drift apart. Either change is refused in one line, before the shards load."""
    run = resumable_copy(two_worker_runs(mode), tmp_path)
    before = (run / "checkpoints" / "last.pt").read_bytes()
    flipped = make_config(tiny_store, run, resume=True, block_momentum=mode == "ddp")
    with pytest.raises(TrainingError) as info:
        train(flipped)
    saved, fix = {
        "ddp": ("DDP (no --block-momentum)", "drop --block-momentum"),
        "bmuf": ("BMUF (--block-momentum)", "pass --block-momentum"),
    }[mode]
    assert str(info.value) == (
        f"{run / 'checkpoints' / 'last.pt'}: checkpoint was trained with {saved}; a resumed "
        f"run cannot change the sync mode: {fix}, or pass --overwrite to replace this run, or "
        "train into a new --out"
    )
    assert (run / "checkpoints" / "last.pt").read_bytes() == before
    assert not (run / "run.json").exists()


@pytest.mark.slow
def test_cli_nproc_2_runs_torchrun(tiny_store: str, run_dir: Path) -> None:
    args = ["train", tiny_store, "--out", str(run_dir), "--nproc", "2", "--epochs", "1",
            "--batch-size", "8", "--device", "cpu", "--no-augment"]  # fmt: skip
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 0, result.output
    assert "trained with 2 workers" in result.output
    # No library warning reaches the terminal raw (torch's DDP deprecation notice was one).
    assert "Warning:" not in result.output and "warnings.warn" not in result.output
    (line,) = assert_metric_lines(run_dir, epochs=1, world_size=2)
    assert line["threads_per_worker"] == 1
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["augment"] is False and run["local_world_size"] == 2
    # Same command again: the run dir is refused before any worker starts.
    again = CliRunner().invoke(cli.main, args)
    assert again.exit_code == 2 and "pass --resume to continue it" in again.output


def test_worker_entry_point_reports_bad_options_in_one_line(
    tiny_store: str, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "landcover.training", tiny_store, "--out", str(tmp_path),
               "--epochs", "0"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "error: --epochs 0 must be >= 1"
