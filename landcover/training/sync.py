"""How the workers of a job keep one model: the `SyncStrategy` the Trainer drives, with a DDP
implementation (gradient all-reduce through a comm hook; also the plain model of a world of
one) and a BMUF implementation (`landcover.comm.bmuf.BlockMomentum`: local steps, block-level
model averages). `build_sync` picks one for a run and restores its resumed state.

The job's one model (validation, `model.pt`, the checkpoint's `model`) is `global_model()`:
the replicas under DDP, the block-level global model under BMUF. BatchNorm statistics are
every rank's: DDP runs with `broadcast_buffers=False`, so each rank's running statistics
follow its own shard through the epoch and `end_epoch` averages them; BMUF averages them at
every block end, and the epoch's end closes a block.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from landcover.comm import CommMeter, CompressionSpec, install_comm_hook
from landcover.comm.bmuf import BlockMomentum, reset_local_momentum
from landcover.training.checkpoint import to_cpu
from landcover.training.config import TrainConfig
from landcover.training.distributed import Collectives

__all__ = ["BmufSync", "DdpSync", "SyncStrategy", "build_sync"]

logger = logging.getLogger(__name__)


class SyncStrategy(Protocol):
    """What the Trainer asks of the synchronisation between workers."""

    module: nn.Module  # the model itself: what is saved and validated
    model: nn.Module  # what the training steps run through (a DDP wrapper, or `module`)
    meter: CommMeter | None  # bytes and time communicated; None: nothing is
    compression: str  # metrics.jsonl's `compression`, normalised ("powersgd" -> "powersgd:2")

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def end_epoch(self, optimizer: torch.optim.Optimizer) -> None:
        """Make the epoch's model whole before anyone looks at it (every rank calls it)."""
        ...

    def global_model(self) -> AbstractContextManager[None]:
        """The job's one model in `module` for the duration."""
        ...

    def own_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """This rank's part of the checkpoint (`Checkpoint.per_rank`)."""
        ...

    def shared_state(self) -> dict[str, Any] | None:
        """The part the same on every rank, saved once (`Checkpoint.bmuf`)."""
        ...


class DdpSync:
    """Synchronous data parallelism: every step's gradients all-reduced through the comm hook
    of `--compression`; with one worker, the plain model and no communication."""

    def __init__(
        self,
        module: nn.Module,
        collectives: Collectives,
        *,
        compression: CompressionSpec,
        device: torch.device,
    ) -> None:
        self.module = module
        self.compression = str(compression)
        self.collectives = collectives
        self.model: nn.Module = module
        self.meter: CommMeter | None = None
        if not collectives.env.is_distributed:
            return
        device_ids = [device.index] if device.type == "cuda" else None
        # Each rank keeps its own BatchNorm statistics through the epoch, averaged at its end
        # (`end_epoch`); broadcasting rank 0's before every forward would throw the others'
        # away. Training itself normalises with batch statistics and never reads them.
        with warnings.catch_warnings():
            # torch 2.15 deprecates broadcast_buffers but its replacement still syncs buffers
            # at init, and its own warning says to keep broadcast_buffers=False until
            # init_sync_buffers exists.
            warnings.filterwarnings(
                "ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning
            )
            self.model = DistributedDataParallel(
                module, device_ids=device_ids, broadcast_buffers=False
            )
        self.meter = install_comm_hook(self.model, compression)

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        pass  # the gradients were averaged in the backward pass

    def end_epoch(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the BatchNorm statistics, which each rank gathered from its own shard."""
        self.collectives.average_float_buffers(self.module)

    def global_model(self) -> AbstractContextManager[None]:
        return nullcontext()  # the replicas already are the job's model

    def own_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {} if self.meter is None else {"comm": to_cpu(self.meter.state_dict())}

    def shared_state(self) -> dict[str, Any] | None:
        return None

    def load(self, own: Mapping[str, Any]) -> None:
        if self.meter is not None and own.get("comm") is not None:
            self.meter.load_state_dict(own["comm"])


class BmufSync:
    """Block momentum: local steps, a block-level model average every `--bmuf-block-steps` steps
    and at every epoch end, the local momentum reset after each unless
    `--keep-local-momentum`."""

    def __init__(self, module: nn.Module, config: TrainConfig) -> None:
        self.module = module
        self.model: nn.Module = module
        self.compression = str(config.compression)
        self.reset_momentum = config.reset_local_momentum
        self.bmuf = BlockMomentum(
            module,
            block_size=config.block_size,
            momentum=config.block_momentum_value,
            block_lr=config.block_lr,
            nesterov=config.nesterov,
        )
        self.meter: CommMeter | None = self.bmuf.meter

    def after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The block end's model average happens whether or not the momentum is reset.
        if self.bmuf.after_optimizer_step() and self.reset_momentum:
            reset_local_momentum(optimizer)

    def end_epoch(self, optimizer: torch.optim.Optimizer) -> None:
        """Merge the partial last block into the global model (a model average, BatchNorm
        statistics included)."""
        if self.bmuf.end_block() and self.reset_momentum:
            reset_local_momentum(optimizer)

    def global_model(self) -> AbstractContextManager[None]:
        """BMUF's block-level global model (each learner's local model back afterwards)."""
        return self.bmuf.global_model()

    def own_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        # Between block ends every learner has its own model and optimizer state. The
        # block-level state (W_global, Δ, the last block end's BatchNorm statistics) is the
        # same on every rank, computed from the same all-reduced values: `shared_state`.
        return {
            "model": to_cpu(self.module.state_dict()),
            "optimizer": to_cpu(optimizer.state_dict()),
        }

    def shared_state(self) -> dict[str, Any] | None:
        state: dict[str, Any] = to_cpu(self.bmuf.state_dict())
        return state


def build_sync(
    module: nn.Module,
    config: TrainConfig,
    collectives: Collectives,
    device: torch.device,
    *,
    own: Mapping[str, Any],
    shared: Mapping[str, Any] | None,
) -> tuple[SyncStrategy, nn.Module]:
    """The run's strategy and the module it trains (SyncBatchNorm-converted under --sync-bn).

    `own`: this rank's resumed state; `shared`: the checkpoint's block-level state. Only
    with the learners' own models does BMUF restore its block-level state: a checkpoint from
    another world size or a DDP run starts it afresh from the model just loaded."""
    if not collectives.env.is_distributed:
        if config.compression.compresses or config.block_momentum:
            logger.warning("one worker: --compression/--block-momentum have nothing to do")
        return DdpSync(module, collectives, compression=config.compression, device=device), module
    if config.sync_bn:  # CUDA only (check_sync_bn); parameters and buffers carry over
        module = nn.SyncBatchNorm.convert_sync_batchnorm(module)  # type: ignore[no-untyped-call]
    if config.block_momentum:
        if "model" not in own:  # fresh start: every learner from rank 0's weights
            collectives.broadcast_module(module)
        bmuf = BmufSync(module, config)
        if shared is not None and "model" in own:
            bmuf.bmuf.load_state_dict(shared)
        return bmuf, module
    ddp = DdpSync(module, collectives, compression=config.compression, device=device)
    ddp.load(own)
    return ddp, module
