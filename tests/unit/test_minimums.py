"""The recipe's minimums: one rule, judged by plan before installing and by validation after."""

from __future__ import annotations

import pytest

from provision.config.minimums import Resources, judge, shortfalls

HOST = Resources(cpu_cores=32, memory_gb=251.5, free_disk_gb={"/root": 30.0, "/data": 900.0},
                 disk_total_gb={"/root": 50.0}, gpu_memory_gb=(23.99, 23.99))
NEED = {"min_cpu_cores": 8, "min_memory_gb": 32, "min_free_disk_gb": 80,
        "min_gpu_memory_gb": 15}


def test_each_shortfall_names_what_how_much_and_the_key() -> None:
    assert shortfalls(NEED, HOST, "recipe llm-finetune") == [
        "free disk /root: 30.0 GB free of 50.0 GB, recipe llm-finetune wants 80 GB "
        "(validation.min_free_disk_gb)"]
    assert [j.what for j in judge(NEED, HOST, "r")] == [
        "cpu cores", "memory", "free disk /root", "free disk /data", "GPU memory (GPU 0)",
        "GPU memory (GPU 1)"]


def test_a_cgroup_limit_is_what_a_job_can_use() -> None:
    # a container sees the machine's RAM and cores in /proc; its cgroup allows less
    boxed = Resources(cpu_cores=128, memory_gb=1007.5, memory_limit_gb=24.0, cpu_limit=6.0)
    assert shortfalls(NEED, boxed, "recipe llm-finetune") == [
        "cpu cores: 6.0 (the cgroup's CPU quota), recipe llm-finetune wants at least 8 "
        "(validation.min_cpu_cores)",
        "memory: 24.0 GB (the cgroup's limit), recipe llm-finetune wants at least 32 GB "
        "(validation.min_memory_gb)"]


@pytest.mark.parametrize("have", [Resources(), Resources(gpu_memory_gb=())])
def test_what_is_not_known_is_not_judged(have: Resources) -> None:
    assert judge(NEED, have, "r") == []


def test_a_small_card_is_short_of_gpu_memory() -> None:
    t4 = Resources(gpu_memory_gb=(15.0,))  # 15360 MiB
    v100 = Resources(gpu_memory_gb=(12.0,))
    assert shortfalls(NEED, t4, "r") == []
    assert shortfalls(NEED, v100, "recipe llm-finetune") == [
        "GPU memory (GPU 0): 12.0 GB, recipe llm-finetune wants at least 15 GB "
        "(validation.min_gpu_memory_gb)"]
