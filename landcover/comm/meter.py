"""The byte and time meter of communication (`CommMeter`) and the counting stand-in for
`torch.distributed` it is fed by.

"Bytes sent" is the payload each rank contributes to collectives per step: the size of every
tensor this rank passes to `all_reduce` (or its input to `all_gather`), summed over a step.
It is counted from the tensors actually handed to the collectives, never from a formula:
torch's own hook code is run with a counting stand-in for `torch.distributed` (see
`rebind_module`), our hooks call the same stand-in (`CountingCollectives`). What goes over the
wire depends on the collective's algorithm (a ring all-reduce moves about 2(N-1)/N times the
payload per rank; an all-gather receives N-1 payloads) and is the same function of the payload
for every mode, so payload bytes compare modes fairly. DDP's own traffic outside the hook (the
initial parameter broadcast, the per-forward buffer broadcast of BatchNorm statistics) is not
gradient communication and is not counted.

Collectives are also counted by kind (`all_reduce`, `all_gather`, `broadcast`): how many a
rank issues and the payload bytes it hands to each kind, and how many gradient buckets its
hooks handled. The scaling projection charges each kind by its own cost model (a ring
all-gather of a payload costs N-1 payloads, an all-reduce 2(N-1)/N) and one latency per
collective, so it needs both; `CommMeter.counts_per_step` gives them per step.

"Comm time" per step is the wall time during which at least one bucket was in its hook:
from the hook call (compression included) to the end of its last callback (decompression
included), as the union of the buckets' intervals, so overlapping buckets count once. It
overlaps the backward pass: it is time with communication outstanding, not time added.

The meter also carries the state of the communication algorithm (onebit residuals, PowerSGD
error feedback) in its `state_dict`, so a checkpoint resume continues the same sequence.
Block momentum (`landcover.comm.bmuf`) meters its model averages with the same classes.
"""

from __future__ import annotations

import logging
import math
import threading
import types
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist

from landcover.comm.counts import CommCounts

logger = logging.getLogger(__name__)

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveKind",
    "CommMeter",
    "CountingCollectives",
    "StatefulAlgorithm",
    "rebind_module",
]

CollectiveKind = Literal["all_reduce", "all_gather", "broadcast"]
COLLECTIVE_KINDS: tuple[CollectiveKind, ...] = ("all_reduce", "all_gather", "broadcast")


class StatefulAlgorithm(Protocol):
    """Communication state that a checkpoint keeps (onebit residuals, PowerSGD errors)."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class CommMeter:
    """Bytes and time a rank spends communicating, counted by the hooks themselves.

    It also carries the communication algorithm's state (onebit residuals, PowerSGD error
    feedback) in `state_dict`, so a checkpoint resume continues the same sequence.
    """

    def __init__(self, label: str = "none") -> None:
        self.label = label
        self._lock = threading.Lock()
        self._algorithm: StatefulAlgorithm | None = None
        self.bytes_sent = 0
        self.steps = 0
        self._time_s = 0.0
        self._intervals: list[tuple[float, float]] = []
        self.calls: dict[str, int] = dict.fromkeys(COLLECTIVE_KINDS, 0)
        self.bytes_by_kind: dict[str, int] = dict.fromkeys(COLLECTIVE_KINDS, 0)
        self.buckets = 0

    def carry(self, algorithm: StatefulAlgorithm) -> None:
        """Keep `algorithm`'s state in this meter's `state_dict` from now on."""
        self._algorithm = algorithm

    def reset(self) -> None:
        """Zero the counters (the algorithm state stays)."""
        with self._lock:
            self.bytes_sent = 0
            self.steps = 0
            self._time_s = 0.0
            self._intervals = []
            self.calls = dict.fromkeys(COLLECTIVE_KINDS, 0)
            self.bytes_by_kind = dict.fromkeys(COLLECTIVE_KINDS, 0)
            self.buckets = 0

    @property
    def comm_time_s(self) -> float:
        """Seconds with communication in flight since the last reset."""
        with self._lock:
            self._merge_intervals()
            return self._time_s

    def bytes_per_step(self) -> float:
        return self.bytes_sent / self.steps if self.steps else 0.0

    def time_per_step_s(self) -> float:
        return self.comm_time_s / self.steps if self.steps else 0.0

    def counts_per_step(self) -> CommCounts:
        """Collectives and their payload bytes per step, by kind (zeros before any step)."""
        with self._lock:
            per = 1 / self.steps if self.steps else 0.0
            calls, sent = self.calls, self.bytes_by_kind
            return CommCounts(
                allreduce_per_step=calls["all_reduce"] * per,
                allreduce_bytes_per_step=sent["all_reduce"] * per,
                allgather_per_step=calls["all_gather"] * per,
                allgather_bytes_per_step=sent["all_gather"] * per,
                broadcast_per_step=calls["broadcast"] * per,
                broadcast_bytes_per_step=sent["broadcast"] * per,
                buckets_per_step=self.buckets * per,
            )

    def state_dict(self) -> dict[str, Any]:
        return {
            "compression": self.label,
            "bytes_sent": self.bytes_sent,
            "comm_time_s": self.comm_time_s,
            "steps": self.steps,
            "calls": dict(self.calls),
            "bytes_by_kind": dict(self.bytes_by_kind),
            "buckets": self.buckets,
            "algorithm": self._algorithm.state_dict() if self._algorithm is not None else {},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        saved = str(state.get("compression", self.label))
        if saved != self.label:
            # Switching compression on resume is legitimate; the old residuals mean nothing.
            logger.warning(
                "checkpoint communication state is for %s, this run uses %s: starting %s fresh",
                saved,
                self.label,
                self.label,
            )
            return
        with self._lock:
            self.bytes_sent = int(state.get("bytes_sent", 0))
            self.steps = int(state.get("steps", 0))
            self._time_s = float(state.get("comm_time_s", 0.0))
            self._intervals = []
            # a checkpoint from before the counts by kind: they restart at zero
            for kind in COLLECTIVE_KINDS:
                self.calls[kind] = int(dict(state.get("calls", {})).get(kind, 0))
                self.bytes_by_kind[kind] = int(dict(state.get("bytes_by_kind", {})).get(kind, 0))
            self.buckets = int(state.get("buckets", 0))
        if self._algorithm is not None:
            self._algorithm.load_state_dict(state.get("algorithm", {}))

    # Called from hook threads (collective callbacks run on the backend's threads).
    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.bytes_sent += count

    def add_collective(self, kind: CollectiveKind, payload_bytes: int) -> None:
        """One collective of `kind` to which this rank handed `payload_bytes`."""
        with self._lock:
            self.bytes_sent += payload_bytes
            self.calls[kind] += 1
            self.bytes_by_kind[kind] += payload_bytes

    def add_bucket(self) -> None:
        """One gradient bucket handled by a hook."""
        with self._lock:
            self.buckets += 1

    def add_step(self) -> None:
        with self._lock:
            self.steps += 1

    def add_interval(self, start_s: float, end_s: float) -> None:
        with self._lock:
            self._intervals.append((start_s, end_s))

    def _merge_intervals(self) -> None:
        # Length of the union of the recorded intervals (the lock is held by the caller).
        end = -math.inf
        for start_s, end_s in sorted(self._intervals):
            if end_s <= end:
                continue
            self._time_s += end_s - max(start_s, end)
            end = end_s
        self._intervals = []


class CountingCollectives:
    """Stands in for `torch.distributed`: same API, counts every payload it is handed."""

    def __init__(self, meter: CommMeter) -> None:
        self._meter = meter

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = dist.ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        self._meter.add_collective("all_reduce", _size(tensor))
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        self._meter.add_collective("all_gather", _size(input_tensor))
        return dist.all_gather_into_tensor(
            output_tensor, input_tensor, group=group, async_op=async_op
        )

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        self._meter.add_collective("all_gather", _size(tensor))
        return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        self._meter.add_collective("broadcast", _size(tensor))
        return dist.broadcast(tensor, src, group=group, async_op=async_op)


def _size(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


_HOOKS_PACKAGE = "torch.distributed.algorithms.ddp_comm_hooks"


def rebind_module(
    module: types.ModuleType, collectives: object, done: dict[str, types.SimpleNamespace]
) -> types.SimpleNamespace:
    """A copy of one of torch's ddp_comm_hooks modules whose code sees `collectives` as `dist`.

    The functions are torch's own code objects with a private globals dict, so torch's hooks
    run unchanged while every collective they issue (also from their callbacks, and from the
    sibling hook modules they call) goes through the counter. Nothing in torch is patched.
    """
    if module.__name__ in done:
        return done[module.__name__]
    namespace: dict[str, Any] = dict(vars(module))
    if namespace.get("dist") is not dist:
        raise RuntimeError(
            f"{module.__name__} no longer calls collectives through `dist`; landcover.comm.meter "
            "cannot count its bytes with this torch version"
        )
    namespace["dist"] = collectives
    proxy = types.SimpleNamespace()
    done[module.__name__] = proxy
    for name, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            clone = types.FunctionType(
                value.__code__, namespace, value.__name__, value.__defaults__, value.__closure__
            )
            clone.__kwdefaults__ = value.__kwdefaults__
            namespace[name] = clone
        elif isinstance(value, types.ModuleType) and value.__name__.startswith(_HOOKS_PACKAGE):
            namespace[name] = rebind_module(value, collectives, done)
    proxy.__dict__.update(namespace)
    return proxy
