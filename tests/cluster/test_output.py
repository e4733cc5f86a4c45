"""What of the agents' output the terminal shows: progress yes, failure noise no."""

from __future__ import annotations

import threading

import pytest

from cluster.output import TerminalFilter, error_message

# What torchrun printed when rank 1 of 2 failed to load its shard (abridged, real lines).
FAILED_RUN = """\
2026-11-23 16:28:59,681 rank 0 INFO tiling.chipstore.store: rank 0/2: loaded 37 train chips in \
0.08 s
error: x.zarr: storage error (ValueError: Stored and computed checksum do not match.)
[rank0]: Traceback (most recent call last):
[rank0]:   File "<frozen runpy>", line 198, in _run_module_as_main
[rank0]:     dist.all_reduce(value)
[rank0]: RuntimeError: [pair.cc:545] Read error [127.0.0.1]:4769: Connection reset by peer.
W1123 16:21:40.883000 7593 torch/distributed/elastic/multiprocessing/api.py:1028] Sending \
process 7672 closing signal SIGTERM
E1123 16:21:40.948000 7593 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 2) local_rank: 1 (pid: 7673) of binary: /usr/bin/python
[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/debug_logger.cc:9] ERROR failed to \
connect, willRetry=1
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 386, in x
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n\
============================================================
landcover.training FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 7673)
============================================================
"""
PROGRESS = "2026-11-23 16:29:05,102 rank 0 INFO landcover.training: epoch 2/2: val mIoU 0.41"


@pytest.mark.parametrize("stop_after_failure", [True, False])
def test_failure_noise_is_hidden_and_progress_shown(stop_after_failure: bool) -> None:
    job_failed = threading.Event()
    terminal = TerminalFilter(job_failed, stop_after_failure=stop_after_failure)
    lines = (FAILED_RUN + "\n" + PROGRESS).splitlines()
    shown = [line for line in lines if terminal.show(line)]
    assert job_failed.is_set()
    # after a restart the progress is news; without restarts nothing after the failure is
    assert shown == [lines[0]] + ([] if stop_after_failure else [PROGRESS])


def test_a_chained_traceback_is_one_block() -> None:
    terminal = TerminalFilter(threading.Event(), stop_after_failure=False)
    block = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1, in <module>',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 3, in <module>',
        "ValueError: y",
        "epoch 3 done",
    ]
    assert [line for line in block if terminal.show(line)] == ["epoch 3 done"]


def test_the_error_line_of_a_log() -> None:
    assert error_message("[rank1]: error: x.zarr: no chip store") == "x.zarr: no chip store"
    assert error_message("ValueError: fake worker failing") == "ValueError: fake worker failing"
    assert error_message("torch.distributed.elastic.ChildFailedError: ") is None
    assert error_message("epoch 1 done") is None


def test_c10d_socket_warnings_without_a_pid_are_hidden_and_not_failures() -> None:
    """c10d warns once per rank when the machine has no reverse DNS: harmless, not shown."""
    job_failed = threading.Event()
    terminal = TerminalFilter(job_failed, stop_after_failure=True)
    line = (
        "[W1123 19:41:50.180100540 socket.cpp:207] [c10d] The hostname of the client socket "
        "cannot be retrieved. err=-3"
    )
    assert not terminal.show(line) and not job_failed.is_set()
    assert terminal.show(PROGRESS)
