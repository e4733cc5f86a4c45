"""The device policy, without torch: which device a rank gets from --device."""

from __future__ import annotations

import pytest

from tiling.runtime.device import DeviceChoiceError, choose_device, rank_device_name


def test_auto_is_the_rank_s_own_gpu_or_the_cpu() -> None:
    assert choose_device("auto", gpu_count=0) == "cpu"
    assert choose_device("auto", gpu_count=2, local_rank=1, local_world_size=2) == "cuda:1"
    assert choose_device("cuda", gpu_count=2, local_rank=3, local_world_size=4) == "cuda:1"
    assert choose_device("cuda:1", gpu_count=2) == "cuda:1"
    assert choose_device("cpu", gpu_count=2) == "cpu"
    assert choose_device("mps", gpu_count=0) == "mps"


def test_training_ranks_get_a_gpu_each_or_are_refused() -> None:
    assert choose_device("cuda", gpu_count=2, local_rank=1, local_world_size=2, gpu_per_rank=True)
    with pytest.raises(DeviceChoiceError, match=r"^3 workers on this node but only 2 GPUs; "):
        choose_device("auto", gpu_count=2, local_rank=0, local_world_size=3, gpu_per_rank=True)


@pytest.mark.parametrize(
    ("text", "gpus", "message"),
    [
        ("meta", 1, "--device meta: landcover predicts on cpu, cuda, cuda:N or mps; use one"),
        ("cpu:2", 1, "--device cpu:2: landcover predicts on cpu, cuda, cuda:N or mps"),
        ("cuda", 0, "--device cuda but no CUDA device is visible; use --device cpu"),
        ("cuda:2", 2, "--device cuda:2: only 2 CUDA device(s) here"),
    ],
)
def test_a_device_that_is_not_here_is_one_line_with_the_fix(
    text: str, gpus: int, message: str
) -> None:
    with pytest.raises(DeviceChoiceError) as info:
        choose_device(text, gpu_count=gpus)
    assert str(info.value).startswith(message)


def test_a_job_s_ranks_share_the_gpus_round_robin() -> None:
    assert [rank_device_name("auto", r, 4) for r in (0, 1, 5)] == ["cuda:0", "cuda:1", "cuda:1"]
    assert rank_device_name("cuda:3", 1, 4) == "cuda:3"
    assert rank_device_name("auto", 1, 0) == "auto"
