"""DDP communication hooks (gradient compression) and the meter of what they send.

Compression (`--compression`, one DDP comm hook per mode; every mode installs a hook):

- `none`: torch's plain averaging all-reduce hook (what DDP does without a hook), so that it
  is measured exactly like the others.
- `fp16`: torch's `fp16_compress_hook` (cast to float16, all-reduce, cast back).
- `bf16`: ours, the same cast/all-reduce/cast with bfloat16: torch's `bf16_compress_hook`
  is refused by DDP on anything but NCCL (by function name), while gloo reduces bf16 fine.
- `powersgd[:RANK]`: torch's `PowerSGDState` + `powerSGD_hook` (Vogels et al. 2019), rank 2 by
  default, error feedback and warm start on, plain all-reduce for the first `start_iter` (>= 2)
  steps. Not `batched_powerSGD_hook`, which is broken in current torch. Buckets run one
  after another: torch's hook issues its P and Q all-reduces from callbacks, so with several
  buckets in flight the ranks issue collectives in different orders (gloo aborts on that).
- `onebit`: 1-bit SGD with error feedback (Seide et al. 2014; EF-SGD, Karimireddy et al.
  2019). Per bucket: add the residual, take the sign of every element and one scale per
  gradient tensor (its mean absolute value, the "scaled sign" of EF-SGD), all-gather the
  signs packed 8 per byte plus the scales, decompress every rank's part and average; the new
  residual is what the compression lost on this rank.

"Bytes sent" is the payload each rank contributes to collectives per step: the size of every
tensor this rank passes to `all_reduce` (or its input to `all_gather`), summed over a step.
It is counted from the tensors actually handed to the collectives, never from a formula:
torch's own hook code is run with a counting stand-in for `torch.distributed` (see
`_rebind_module`), our hooks call the same stand-in. What goes over the wire depends on the
collective's algorithm (a ring all-reduce moves about 2(N-1)/N times the payload per rank; an
all-gather receives N-1 payloads) and is the same function of the payload for every mode, so
payload bytes compare modes fairly. DDP's own traffic outside the hook (the initial parameter
broadcast, the per-forward buffer broadcast of BatchNorm statistics) is not gradient
communication and is not counted.

"Comm time" per step is the wall time during which at least one bucket was in its hook:
from the hook call (compression included) to the end of its last callback (decompression
included), as the union of the buckets' intervals, so overlapping buckets count once. It
overlaps the backward pass: it is time with communication outstanding, not time added.

Error-feedback state (onebit residuals; PowerSGD errors and warm-start Q matrices) is kept per
bucket but keyed by the names of the bucket's parameters, not by bucket index. DDP rebuilds its
buckets after the first iteration (and again after every restart), so an index names different
parameters at different times; with name keys, state of a bucket that no longer exists is split
back into per-parameter pieces and reassembled for the new buckets. `CommMeter.state_dict()`
stores this state per parameter, so a checkpoint resumed with a different bucket layout
continues exactly where it stopped.

Block momentum (BMUF), which replaces the gradient all-reduce instead of hooking into it, is in
`landcover.comm.bmuf`; it meters its model averages with the same `CommMeter`.
"""

# No `from __future__ import annotations` here: DistributedDataParallel.register_comm_hook
# compares the hook's `bucket` annotation with GradBucket at run time, and a string
# annotation fails that check.

import logging
import math
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast, get_args

import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket  # the same class as dist.GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd_hooks

from landcover.errors import TrainingError

logger = logging.getLogger(__name__)

CompressionKind = Literal["none", "fp16", "bf16", "powersgd", "onebit"]
COMPRESSION_KINDS: tuple[str, ...] = get_args(CompressionKind)
COMPRESSION_FORMS = "none, fp16, bf16, powersgd[:RANK] (e.g. powersgd:4), onebit"
POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's default: compress a matrix only if it shrinks 2x

Future = torch.futures.Future[torch.Tensor]
BucketKey = tuple[str, ...]


# -- the compression spec -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompressionSpec:
    """A gradient compression mode. `rank` and `start_iter` matter for PowerSGD only;
    `error_feedback=False` (onebit only) is the plain scaled-sign baseline, for comparison."""

    kind: CompressionKind = "none"
    rank: int = 2
    start_iter: int = 2
    error_feedback: bool = True

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSION_KINDS:
            raise TrainingError(f"compression {self.kind!r} is not known; use {COMPRESSION_FORMS}")
        if self.rank < 1:
            raise TrainingError(f"PowerSGD rank {self.rank} must be a positive integer")
        if self.start_iter < 2:
            raise TrainingError(
                f"PowerSGD start_iter {self.start_iter} must be >= 2: DDP rebuilds its buckets "
                "after the first step"
            )

    def __str__(self) -> str:
        if self.kind == "powersgd":
            return f"powersgd:{self.rank}"
        if self.kind == "onebit" and not self.error_feedback:
            return "onebit-no-ef"
        return self.kind


def parse_compression(text: str) -> CompressionSpec:
    """Parse `--compression`: none | fp16 | bf16 | powersgd[:RANK] | onebit."""
    value = text.strip().lower()
    kind, sep, rank_text = value.partition(":")
    if kind == "powersgd":
        if not sep:
            return CompressionSpec("powersgd")
        if rank_text.isdigit() and int(rank_text) >= 1:
            return CompressionSpec("powersgd", rank=int(rank_text))
    elif not sep and kind in COMPRESSION_KINDS:
        return CompressionSpec(cast(CompressionKind, kind))
    raise TrainingError(f"--compression {text!r} is not valid; use one of: {COMPRESSION_FORMS}")


# -- the meter ----------------------------------------------------------------------------------


class _StatefulAlgorithm(Protocol):
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
        self._algorithm: _StatefulAlgorithm | None = None
        self.bytes_sent = 0
        self.steps = 0
        self._time_s = 0.0
        self._intervals: list[tuple[float, float]] = []

    def reset(self) -> None:
        """Zero the counters (the algorithm state stays)."""
        with self._lock:
            self.bytes_sent = 0
            self.steps = 0
            self._time_s = 0.0
            self._intervals = []

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

    def state_dict(self) -> dict[str, Any]:
        return {
            "compression": self.label,
            "bytes_sent": self.bytes_sent,
            "comm_time_s": self.comm_time_s,
            "steps": self.steps,
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
        if self._algorithm is not None:
            self._algorithm.load_state_dict(state.get("algorithm", {}))

    # Called from hook threads (collective callbacks run on the backend's threads).
    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.bytes_sent += count

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
        self._meter.add_bytes(tensor.numel() * tensor.element_size())
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        self._meter.add_bytes(input_tensor.numel() * input_tensor.element_size())
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
        self._meter.add_bytes(tensor.numel() * tensor.element_size())
        return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


_HOOKS_PACKAGE = "torch.distributed.algorithms.ddp_comm_hooks"


def _rebind_module(
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
            f"{module.__name__} no longer calls collectives through `dist`; landcover.comm.hooks "
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
            namespace[name] = _rebind_module(value, collectives, done)
    proxy.__dict__.update(namespace)
    return proxy


# -- per-parameter decomposition of per-bucket state --------------------------------------------


def _split(flat: torch.Tensor, names: Sequence[str], lengths: Sequence[int]) -> dict[str, Any]:
    return {
        name: piece.detach().clone()
        for name, piece in zip(names, torch.split(flat, list(lengths)), strict=True)
    }


def _join(
    pending: dict[str, torch.Tensor],
    names: Sequence[str],
    lengths: Sequence[int],
    like: torch.Tensor,
    *,
    require_all: bool,
) -> torch.Tensor | None:
    """Concatenate (and remove) the pending pieces for `names`; zeros where one is missing."""
    present = [name in pending for name in names]
    if not any(present) or (require_all and not all(present)):
        return None
    pieces = [
        pending.pop(name).reshape(-1).to(device=like.device, dtype=like.dtype)
        if name in pending
        else torch.zeros(length, device=like.device, dtype=like.dtype)
        for name, length in zip(names, lengths, strict=True)
    ]
    return torch.cat(pieces)


class _BucketNames:
    """Maps a DDP bucket to the names of its parameters (the stable key of its state)."""

    def __init__(self, module: nn.Module) -> None:
        self._params = dict(module.named_parameters())  # keeps the ids below alive
        self._names = {id(p): name for name, p in self._params.items()}

    def key(self, bucket: GradBucket) -> BucketKey:
        try:
            return tuple(self._names[id(p)] for p in bucket.parameters())
        except KeyError:
            raise RuntimeError("a DDP bucket holds a parameter the model does not name") from None


class _KeyedBucket:
    """A GradBucket whose `index()` is its parameter-name key, for torch's PowerSGD hook,
    which keys its error-feedback and warm-start dicts by `bucket.index()`."""

    def __init__(self, bucket: GradBucket, key: BucketKey) -> None:
        self._bucket = bucket
        self._key = key

    def index(self) -> BucketKey:
        return self._key

    def buffer(self) -> torch.Tensor:
        return self._bucket.buffer()

    def gradients(self) -> list[torch.Tensor]:
        return self._bucket.gradients()

    def parameters(self) -> list[torch.Tensor]:
        return self._bucket.parameters()

    def is_last(self) -> bool:
        return self._bucket.is_last()

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._bucket.set_buffer(tensor)


# -- the hooks ----------------------------------------------------------------------------------


class _Communicate(Protocol):
    def __call__(self, bucket: GradBucket) -> Future: ...


class _MeteredHook:
    """The function DDP calls per bucket: counts steps and times the bucket's communication."""

    def __init__(self, meter: CommMeter, communicate: _Communicate) -> None:
        self._meter = meter
        self._communicate = communicate

    def hook(self, state: object, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        start_s = time.perf_counter()
        if bucket.is_last():
            self._meter.add_step()
        future = self._communicate(bucket)

        def finished(done: Future) -> torch.Tensor:
            self._meter.add_interval(start_s, time.perf_counter())
            value: torch.Tensor = done.value()
            return value

        return future.then(finished)


class _CastAllReduce:
    """bf16 (or any dtype) cast, averaging all-reduce, cast back; works on gloo and NCCL."""

    def __init__(self, collectives: Any, group: Any, dtype: torch.dtype) -> None:
        self._collectives = collectives
        self._group = group
        self._dtype = dtype

    def __call__(self, bucket: GradBucket) -> Future:
        buffer = bucket.buffer()
        world_size = dist.get_world_size(self._group)
        compressed = buffer.to(self._dtype).div_(world_size)
        work = self._collectives.all_reduce(compressed, group=self._group, async_op=True)

        def decompress(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            buffer.copy_(done.value()[0])
            return buffer

        return cast(Future, work.get_future().then(decompress))


_BIT_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Bool (n,) → uint8 (ceil(n/8),), most significant bit first."""
    padded = torch.zeros(-(-bits.numel() // 8) * 8, dtype=torch.uint8, device=bits.device)
    padded[: bits.numel()] = bits
    weights = torch.bitwise_left_shift(1, _BIT_SHIFTS.to(bits.device)).to(torch.uint8)
    return (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)


def _unpack_bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    shifts = _BIT_SHIFTS.to(packed.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(packed.unsqueeze(1), shifts), 1)
    return bits.reshape(-1)[:count].bool()


class _OneBit:
    """1-bit SGD with error feedback, per bucket, with one scale per gradient tensor."""

    def __init__(
        self, collectives: Any, group: Any, names: _BucketNames, *, error_feedback: bool
    ) -> None:
        self._collectives = collectives
        self._group = group
        self._names = names
        self._error_feedback = error_feedback
        self._residuals: dict[BucketKey, torch.Tensor] = {}
        self._lengths: dict[BucketKey, list[int]] = {}
        self._pending: dict[str, torch.Tensor] = {}  # per-parameter residuals not yet placed

    def __call__(self, bucket: GradBucket) -> Future:
        buffer = bucket.buffer()
        key = self._names.key(bucket)
        lengths = [p.numel() for p in bucket.parameters()]
        count = buffer.numel()
        world_size = dist.get_world_size(self._group)
        corrected = buffer.to(torch.float32, copy=True)
        if self._error_feedback:
            residual = self._residual_for(key, lengths, corrected)
            if residual is not None:
                corrected += residual
        repeats = torch.tensor(lengths, device=buffer.device)
        # max(.., 1): an empty parameter gets scale 0, not NaN
        scales = torch.stack(
            [piece.abs().sum() / max(piece.numel(), 1) for piece in torch.split(corrected, lengths)]
        )
        bits = corrected >= 0
        if self._error_feedback:
            own = torch.where(bits, 1.0, -1.0) * torch.repeat_interleave(scales, repeats)
            self._residuals[key] = corrected - own
            self._lengths[key] = lengths
        packed_bytes = -(-count // 8)
        payload = torch.cat([_pack_bits(bits), scales.view(torch.uint8)])
        gathered = payload.new_empty(world_size * payload.numel())
        work = self._collectives.all_gather_into_tensor(
            gathered, payload, group=self._group, async_op=True
        )

        def decompress(done: torch.futures.Future[Any]) -> torch.Tensor:
            done.value()  # re-raises a failed collective
            total = torch.zeros(count, dtype=torch.float32, device=buffer.device)
            for row in gathered.view(world_size, -1):
                rank_bits = _unpack_bits(row[:packed_bytes], count)
                rank_scales = row[packed_bytes:].clone().view(torch.float32)
                signs = torch.where(rank_bits, 1.0, -1.0)
                total += signs * torch.repeat_interleave(rank_scales, repeats)
            buffer.copy_(total.div_(world_size))
            return buffer

        return cast(Future, work.get_future().then(decompress))

    def _residual_for(
        self, key: BucketKey, lengths: list[int], like: torch.Tensor
    ) -> torch.Tensor | None:
        if key in self._residuals:
            return self._residuals.pop(key)
        # A new bucket layout: earlier buckets sharing a parameter are stale (their
        # iteration is over), so split them back into per-parameter pieces first.
        names = set(key)
        for old in [k for k in self._residuals if names.intersection(k)]:
            self._pending.update(_split(self._residuals.pop(old), old, self._lengths.pop(old)))
        return _join(self._pending, key, lengths, like, require_all=False)

    def state_dict(self) -> dict[str, Any]:
        residual = dict(self._pending)
        for key, flat in self._residuals.items():
            residual.update(_split(flat, key, self._lengths[key]))
        return {"residual": {name: t.detach().cpu().clone() for name, t in residual.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._residuals.clear()
        self._lengths.clear()
        self._pending = {str(k): v.clone() for k, v in dict(state.get("residual", {})).items()}


class _PowerSGD:
    """torch's PowerSGD hook, with its state keyed by parameter names (see module docstring)."""

    def __init__(
        self, collectives: Any, group: Any, names: _BucketNames, spec: CompressionSpec
    ) -> None:
        hooks = _rebind_module(powersgd_hooks, collectives, {})
        self._hook: Callable[[Any, Any], Future] = hooks.powerSGD_hook
        self._names = names
        # Any: torch types the dicts by int index; ours are keyed by name tuples.
        self.state: Any = powersgd_hooks.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=spec.rank,
            start_powerSGD_iter=spec.start_iter,
            min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE,
            use_error_feedback=True,
            warm_start=True,
            random_seed=0,
            batch_tensors_with_same_shape=False,
        )
        self._shapes: dict[BucketKey, list[torch.Size]] = {}
        self._pending_error: dict[str, torch.Tensor] = {}
        self._pending_q: dict[str, torch.Tensor] = {}
        self._tail: Future | None = None

    def __call__(self, bucket: GradBucket) -> Future:
        # torch's hook issues its P and Q all-reduces from callbacks, on the backend's
        # threads; with several buckets in flight the ranks then issue collectives in
        # different orders (gloo aborts on the mismatch). Chaining each bucket after the
        # previous one keeps the order U0 P0 Q0 U1 P1 Q1 ... on every rank. Callbacks only
        # chain, never wait: a callback blocked on a collective holds a backend thread.
        result: Future = torch.futures.Future()

        def start(_: object) -> None:
            try:
                key = self._names.key(bucket)
                self._shapes[key] = [p.shape for p in bucket.parameters()]
                if self.state.iter >= self.state.start_powerSGD_iter:
                    self._place_state(key, bucket.buffer())
                inner = self._hook(self.state, _KeyedBucket(bucket, key))
            except Exception as exc:
                result.set_exception(cast(Any, exc))
                return
            inner.add_done_callback(lambda done: _forward(done, result))

        previous, self._tail = self._tail, result
        if previous is None:
            start(None)
        else:
            previous.add_done_callback(start)
        return result

    def _q_layout(self, key: BucketKey) -> list[tuple[str, int, int]]:
        """(name, P length, Q length) of the matrices torch compresses, in its memory order:
        grouped by matrix shape in order of first appearance (torch's `shape_to_tensors`)."""
        groups: dict[tuple[int, int], list[tuple[str, int, int]]] = {}
        for name, shape in zip(key, self._shapes[key], strict=True):
            rows = shape[0]
            cols = math.prod(shape) // rows
            rank = min(rows, cols, self.state.matrix_approximation_rank)
            if (rows + cols) * rank * self.state.min_compression_rate < rows * cols:
                groups.setdefault((rows, cols), []).append((name, rows * rank, cols * rank))
        return [entry for group in groups.values() for entry in group]

    def _place_state(self, key: BucketKey, like: torch.Tensor) -> None:
        state = self.state
        if key in state.error_dict:
            return
        names = set(key)
        for old in [k for k in state.error_dict if names.intersection(k)]:
            self._to_pending(old)
        lengths = [math.prod(shape) for shape in self._shapes[key]]
        error = _join(self._pending_error, key, lengths, like, require_all=False)
        if error is not None:
            state.error_dict[key] = error
        layout = self._q_layout(key)
        q_names = [name for name, _, _ in layout]
        q_lengths = [q_len for _, _, q_len in layout]
        q = _join(self._pending_q, q_names, q_lengths, like, require_all=True)
        if q is not None:
            state.q_memory_dict[key] = q
            # P is recomputed from Q before use; it only has to exist with the right size.
            state.p_memory_dict[key] = like.new_empty(sum(p_len for _, p_len, _ in layout))

    def _to_pending(self, key: BucketKey) -> None:
        state = self.state
        lengths = [math.prod(shape) for shape in self._shapes[key]]
        self._pending_error.update(_split(state.error_dict.pop(key), key, lengths))
        state.p_memory_dict.pop(key, None)
        q = state.q_memory_dict.pop(key, None)
        if q is not None:
            layout = self._q_layout(key)
            q_lengths = [q_len for _, _, q_len in layout]
            self._pending_q.update(_split(q, [name for name, _, _ in layout], q_lengths))

    def state_dict(self) -> dict[str, Any]:
        state = self.state
        error = dict(self._pending_error)
        q_pieces = dict(self._pending_q)
        for key, flat in state.error_dict.items():
            error.update(_split(flat, key, [math.prod(s) for s in self._shapes[key]]))
        for key, flat in state.q_memory_dict.items():
            layout = self._q_layout(key)
            q_pieces.update(
                _split(flat, [name for name, _, _ in layout], [q_len for _, _, q_len in layout])
            )
        _, keys, position, has_gauss, cached_gaussian = state.rng.get_state()
        return {
            "iter": int(state.iter),
            "error": {k: v.detach().cpu().clone() for k, v in error.items()},
            "q": {k: v.detach().cpu().clone() for k, v in q_pieces.items()},
            "rng_keys": torch.from_numpy(keys.astype("int64")),
            "rng_position": int(position),
            "rng_has_gauss": int(has_gauss),
            "rng_cached_gaussian": float(cached_gaussian),
            "numel_before": int(state.total_numel_before_compression),
            "numel_after": int(state.total_numel_after_compression),
        }

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        if not saved:
            return
        state = self.state
        state.error_dict.clear()
        state.p_memory_dict.clear()
        state.q_memory_dict.clear()
        state.iter = int(saved["iter"])
        self._pending_error = {str(k): v.clone() for k, v in dict(saved["error"]).items()}
        self._pending_q = {str(k): v.clone() for k, v in dict(saved["q"]).items()}
        keys = saved["rng_keys"].numpy().astype("uint32")
        state.rng.set_state(
            (
                "MT19937",
                keys,
                int(saved["rng_position"]),
                int(saved["rng_has_gauss"]),
                float(saved["rng_cached_gaussian"]),
            )
        )
        state.total_numel_before_compression = int(saved["numel_before"])
        state.total_numel_after_compression = int(saved["numel_after"])


def _forward(done: Future, result: Future) -> None:
    try:
        result.set_result(done.value())
    except Exception as exc:
        result.set_exception(cast(Any, exc))


class _NoState:
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None


def install_comm_hook(ddp_model: nn.Module, spec: CompressionSpec) -> CommMeter:
    """Register the hook for `spec` on a DistributedDataParallel model; returns its meter.

    Call once, before the first backward pass, on every rank.
    """
    if not isinstance(ddp_model, nn.parallel.DistributedDataParallel):
        raise TrainingError(
            f"install_comm_hook needs a DistributedDataParallel model, got "
            f"{type(ddp_model).__name__}; wrap the model in DDP first (or use BlockMomentum)"
        )
    meter = CommMeter(str(spec))
    collectives = CountingCollectives(meter)
    group = ddp_model.process_group
    names = _BucketNames(ddp_model.module)
    communicate: _Communicate
    algorithm: _StatefulAlgorithm = _NoState()
    if spec.kind in ("none", "fp16"):
        hooks = _rebind_module(default_hooks, collectives, {})
        torch_hook = hooks.allreduce_hook if spec.kind == "none" else hooks.fp16_compress_hook

        def communicate(bucket: GradBucket) -> Future:
            return cast(Future, torch_hook(group, bucket))

    elif spec.kind == "bf16":
        communicate = _CastAllReduce(collectives, group, torch.bfloat16)
    elif spec.kind == "onebit":
        onebit = _OneBit(collectives, group, names, error_feedback=spec.error_feedback)
        communicate, algorithm = onebit, onebit
    else:
        powersgd = _PowerSGD(collectives, group, names, spec)
        communicate, algorithm = powersgd, powersgd
    meter._algorithm = algorithm
    ddp_model.register_comm_hook(None, _MeteredHook(meter, communicate).hook)
    logger.info("communication hook: %s", spec)
    return meter


# -- block momentum (BMUF) ----------------------------------------------------------------------
