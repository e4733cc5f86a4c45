"""`powersgd[:RANK]` compression: torch's `PowerSGDState` + `powerSGD_hook` (Vogels et al. 2019)
with its state keyed by parameter names (`landcover.comm.buckets`).

Rank 2 by default, error feedback and warm start on, plain all-reduce for the first
`start_iter` (>= 2) steps. Not `batched_powerSGD_hook`, which is broken in current torch.
Buckets run one after another: torch's hook issues its P and Q all-reduces from callbacks, so
with several buckets in flight the ranks issue collectives in different orders (gloo aborts on
that). torch's hook code runs with the counting collectives of `landcover.comm.meter`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch._C._distributed_c10d import GradBucket  # the same class as dist.GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd_hooks

from landcover.comm.buckets import (
    BucketKey,
    BucketNames,
    Future,
    KeyedBucket,
    join_state,
    split_state,
)
from landcover.comm.meter import rebind_module
from landcover.comm.spec import CompressionSpec

__all__ = ["POWERSGD_MIN_COMPRESSION_RATE", "PowerSGD"]

POWERSGD_MIN_COMPRESSION_RATE = 2  # torch's default: compress a matrix only if it shrinks 2x


class PowerSGD:
    """torch's PowerSGD hook, with its state keyed by parameter names (see the module docstring)."""

    def __init__(
        self, collectives: Any, group: Any, names: BucketNames, spec: CompressionSpec
    ) -> None:
        hooks = rebind_module(powersgd_hooks, collectives, {})
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
                inner = self._hook(self.state, KeyedBucket(bucket, key))
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
        error = join_state(self._pending_error, key, lengths, like, require_all=False)
        if error is not None:
            state.error_dict[key] = error
        layout = self._q_layout(key)
        q_names = [name for name, _, _ in layout]
        q_lengths = [q_len for _, _, q_len in layout]
        q = join_state(self._pending_q, q_names, q_lengths, like, require_all=True)
        if q is not None:
            state.q_memory_dict[key] = q
            # P is recomputed from Q before use; it only has to exist with the right size.
            state.p_memory_dict[key] = like.new_empty(sum(p_len for _, p_len, _ in layout))

    def _to_pending(self, key: BucketKey) -> None:
        state = self.state
        lengths = [math.prod(shape) for shape in self._shapes[key]]
        self._pending_error.update(split_state(state.error_dict.pop(key), key, lengths))
        state.p_memory_dict.pop(key, None)
        q = state.q_memory_dict.pop(key, None)
        if q is not None:
            layout = self._q_layout(key)
            q_lengths = [q_len for _, _, q_len in layout]
            self._pending_q.update(split_state(q, [name for name, _, _ in layout], q_lengths))

    def state_dict(self) -> dict[str, Any]:
        state = self.state
        error = dict(self._pending_error)
        q_pieces = dict(self._pending_q)
        for key, flat in state.error_dict.items():
            error.update(split_state(flat, key, [math.prod(s) for s in self._shapes[key]]))
        for key, flat in state.q_memory_dict.items():
            layout = self._q_layout(key)
            q_pieces.update(
                split_state(
                    flat, [name for name, _, _ in layout], [q_len for _, _, q_len in layout]
                )
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
