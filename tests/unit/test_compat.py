"""The wheel rule as a table: every torch minor 1.11..2.14, every GPU generation, both policies."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from provision.errors import NoWheelError, ProvisionError
from provision.wheels.data import dotted, load_compat
from provision.wheels.rule import choose_torch, torch_spec

# driver, compute caps, python, torch spec, policy, glibc -> torch, variant
FITS = [
    # Ada on 550 (CUDA 12.4): strict keeps cu124 and older; the newest release with one is 2.7.1
    ("ada-550-strict", "550.54.14", ["8.9"], "3.10", None, "strict", None, "2.7.1", "cu118"),
    ("ada-550-minor", "550.54.14", ["8.9"], "3.10", None, "minor", None, "2.14.1", "cu126"),
    ("ada-550-spec-2.5", "550.54.14", ["8.9"], "3.10", "2.5", "strict", None, "2.5.1", "cu124"),
    ("ada-550-spec-exact", "550.54.14", ["8.9"], "3.10", "2.5.0", "strict", None, "2.5.0", "cu124"),
    ("ada-550-spec-range", "550.54.14", ["8.9"], "3.10", ">=2.4,<2.6", "strict", None, "2.5.1", "cu124"),
    ("ada-550-spec-2.4", "550.54.14", ["8.9"], "3.10", "2.4", "strict", None, "2.4.1", "cu124"),
    ("ada-550-spec-2.3", "550.54.14", ["8.9"], "3.10", "2.3", "strict", None, "2.3.1", "cu121"),
    ("ada-550-spec-2.2", "550.54.14", ["8.9"], "3.10", "2.2", "strict", None, "2.2.2", "cu121"),
    ("ada-550-spec-2.1", "550.54.14", ["8.9"], "3.10", "2.1", "strict", None, "2.1.2", "cu121"),
    ("ada-550-spec-2.0", "550.54.14", ["8.9"], "3.10", "2.0", "strict", None, "2.0.1", "cu118"),
    ("ada-550-spec-2.6", "550.54.14", ["8.9"], "3.10", "2.6", "strict", None, "2.6.0", "cu124"),
    ("hopper-590", "590.48.01", ["9.0"], "3.11", None, "strict", None, "2.14.1", "cu130"),
    ("hopper-590-spec-2.14.0", "590.48.01", ["9.0"], "3.11", "2.14.0", "strict", None, "2.14.0", "cu130"),
    ("hopper-590-spec-2.13", "590.48.01", ["9.0"], "3.11", "2.13", "strict", None, "2.13.0", "cu130"),
    ("hopper-590-spec-2.12", "590.48.01", ["9.0"], "3.11", "2.12", "strict", None, "2.12.1", "cu130"),
    ("hopper-590-spec-2.11", "590.48.01", ["9.0"], "3.11", "2.11", "strict", None, "2.11.0", "cu130"),
    ("hopper-590-spec-2.10", "590.48.01", ["9.0"], "3.11", "2.10", "strict", None, "2.10.0", "cu130"),
    ("hopper-590-spec-2.9", "590.48.01", ["9.0"], "3.11", "2.9", "strict", None, "2.9.1", "cu130"),
    ("hopper-590-spec-2.8", "590.48.01", ["9.0"], "3.11", "2.8", "strict", None, "2.8.0", "cu129"),
    ("hopper-590-spec-2.7", "590.48.01", ["9.0"], "3.11", "2.7", "strict", None, "2.7.1", "cu128"),
    ("hopper-595-cu132", "595.71.05", ["9.0"], "3.11", None, "strict", None, "2.14.1", "cu132"),
    ("blackwell-580", "580.65.06", ["12.0"], "3.12", None, "strict", None, "2.14.1", "cu130"),
    ("blackwell-570", "570.195.03", ["12.0"], "3.12", None, "strict", None, "2.11.0", "cu128"),
    ("blackwell-dc-570", "570.195.03", ["10.0"], "3.12", None, "strict", None, "2.11.0", "cu128"),
    ("blackwell-550-minor", "550.54.14", ["12.0"], "3.10", None, "minor", None, "2.11.0", "cu128"),
    ("gb10-sm121-on-sm120-sass", "580.65.06", ["12.1"], "3.11", None, "strict", None, "2.14.1", "cu130"),
    ("ampere-575", "575.57.08", ["8.6"], "3.11", None, "strict", None, "2.14.1", "cu126"),
    ("ampere-560", "560.35.03", ["8.6"], "3.11", None, "strict", None, "2.14.1", "cu126"),
    ("a100-535-strict", "535.183.01", ["8.0"], "3.10", None, "strict", None, "2.7.1", "cu118"),
    ("a100-535-minor", "535.183.01", ["8.0"], "3.10", None, "minor", None, "2.14.1", "cu126"),
    ("ampere-525", "525.60.13", ["8.6"], "3.10", None, "strict", None, "2.7.1", "cu118"),
    ("orin-sm87-on-sm80-sass", "580.65.06", ["8.7"], "3.11", None, "strict", None, "2.14.1", "cu130"),
    ("turing-470-strict", "470.57.02", ["7.5"], "3.9", None, "strict", None, "1.12.1", "cu113"),
    ("turing-470-minor", "470.57.02", ["7.5"], "3.9", None, "minor", None, "2.7.1", "cu118"),
    ("turing-440-cu102-via-sm70", "440.33", ["7.5"], "3.7", None, "strict", None, "1.12.1", "cu102"),
    ("kepler-k80-470-strict", "470.256.02", ["3.7"], "3.9", None, "strict", None, "1.12.1", "cu113"),
    ("kepler-k80-470-minor", "470.256.02", ["3.7"], "3.9", None, "minor", None, "2.7.1", "cu118"),
    ("kepler-spec-1.11", "470.256.02", ["3.7"], "3.9", "1.11", "strict", None, "1.11.0", "cu113"),
    ("maxwell-580", "580.82.09", ["5.2"], "3.11", None, "strict", None, "2.14.1", "cu126"),
    ("pascal-580", "580.82.09", ["6.1"], "3.12", None, "strict", None, "2.14.1", "cu126"),
    ("volta-580", "580.82.09", ["7.0"], "3.12", None, "strict", None, "2.14.1", "cu126"),
    ("volta-450-cu102", "450.80.02", ["7.0"], "3.8", None, "strict", None, "1.12.1", "cu102"),
    ("mixed-volta-ada", "580.82.09", ["7.0", "8.9"], "3.12", None, "strict", None, "2.14.1", "cu126"),
    ("mixed-volta-blackwell", "580.82.09", ["7.0", "12.0"], "3.12", None, "strict", None, "2.10.0", "cu128"),
    ("centos7-glibc-2.17", "550.144.03", ["8.6"], "3.10", None, "strict", "2.17", "2.6.0", "cu124"),
    ("centos7-glibc-2.17-minor", "550.144.03", ["8.6"], "3.10", None, "minor", "2.17", "2.6.0", "cu124"),
    ("hopper-520-cu118", "520.61.05", ["9.0"], "3.10", None, "strict", None, "2.7.1", "cu118"),
    ("ampere-515-spec-1.13", "515.43.04", ["8.6"], "3.10", "1.13", "strict", None, "1.13.1", "cu117"),
    ("ampere-510-py37", "510.39.01", ["8.6"], "3.7", None, "strict", None, "1.13.1", "cu116"),
    ("python-3.13-blackwell-595", "595.45.04", ["12.0"], "3.13", None, "strict", None, "2.14.1", "cu132"),
    ("driver-610-umd-13.3", "610.43.02", ["12.0"], "3.14", None, "strict", None, "2.14.1", "cu132"),
    ("no-gpu-py311", None, [], "3.11", None, "strict", None, "2.14.1", "cpu"),
    ("no-gpu-py38-ends-2.4", None, [], "3.8", None, "strict", None, "2.4.1", "cpu"),
    ("no-gpu-spec-2.3", None, [], "3.12", "2.3", "strict", None, "2.3.1", "cpu"),
    ("no-gpu-glibc-2.17", None, [], "3.11", None, "strict", "2.17", "2.6.0", "cpu"),
]


@pytest.mark.parametrize("name,driver,caps,python,spec,policy,glibc,torch,variant", FITS,
                         ids=[c[0] for c in FITS])
def test_wheel_rule(name: str, driver: str | None, caps: list[str], python: str,
                    spec: str | None, policy: str, glibc: str | None, torch: str,
                    variant: str) -> None:
    choice = choose_torch(driver=driver, compute_caps=caps, python=python, torch=spec,
                          cuda_compat=policy, glibc=glibc)
    assert (choice.torch, choice.cuda) == (torch, variant)
    assert choice.index_url == f"https://download.pytorch.org/whl/{variant}/"


# driver, caps, python, spec, policy, glibc -> words the message must contain
ERRORS = [
    ("blackwell-on-550", "550.54.14", ["12.0"], "3.10", None, "strict", None,
     ["driver >= 570.26 allows torch 2.7+cu128, the first with sm_120", "--cuda-compat minor"]),
    ("hopper-on-515", "515.43.04", ["9.0"], "3.10", None, "strict", None,
     ["driver >= 520.61.05 allows torch 2.0+cu118, the first with sm_90"]),
    ("kepler-sm35", "580.65.06", ["3.5"], "3.11", None, "strict", None,
     ["no torch wheel", "sm_35", "older than every official PyTorch build"]),
    ("kepler-plus-blackwell", "580.65.06", ["3.7", "12.0"], "3.11", None, "strict", None,
     ["no single torch wheel", "sm_37, sm_120"]),
    ("python-3.15", "590.48.01", ["9.0"], "3.15", None, "strict", None,
     ["python 3.10..3.14 allows torch 2.14.1"]),
    ("old-spec-new-gpu", "590.48.01", ["9.0"], "3.10", "1.13", "strict", None,
     ["no torch release matching '1.13' ships kernels for sm_90"]),
    ("unknown-release", "590.48.01", ["9.0"], "3.11", "2.99", "strict", None,
     ["no torch release in the data matches the spec '2.99'"]),
    ("centos7-torch-2.7", "550.144.03", ["8.6"], "3.10", ">=2.7", "strict", "2.17",
     ["glibc >= 2.28", "glibc 2.17 is too old"]),
    ("gpu-without-driver", None, ["8.6"], "3.11", None, "strict", None,
     ["no NVIDIA driver answers"]),
]


@pytest.mark.parametrize("name,driver,caps,python,spec,policy,glibc,words", ERRORS,
                         ids=[c[0] for c in ERRORS])
def test_wheel_rule_errors(name: str, driver: str | None, caps: list[str], python: str,
                           spec: str | None, policy: str, glibc: str | None,
                           words: list[str]) -> None:
    with pytest.raises(NoWheelError) as err:
        choose_torch(driver=driver, compute_caps=caps, python=python, torch=spec,
                     cuda_compat=policy, glibc=glibc)
    for w in words:
        assert w in str(err.value)
    assert err.value.exit_code == 2


def test_reported_cuda_beats_the_table() -> None:
    # The table puts 565.57.01 at CUDA 12.6; a driver that reports 12.8 is taken at its word.
    table = choose_torch(driver="565.57.01", compute_caps=["8.9"], python="3.11", torch="2.11")
    told = choose_torch(driver="565.57.01", driver_cuda="12.8", compute_caps=["8.9"],
                        python="3.11", torch="2.11")
    assert (table.cuda, told.cuda) == ("cu126", "cu128")
    assert "reported by the driver" in told.reasons[0]


def test_minor_policy_names_its_risk() -> None:
    c = choose_torch(driver="550.54.14", compute_caps=["8.9"], python="3.10", cuda_compat="minor")
    assert c.risks and "PTX JIT" in c.risks[0] and "560.28.03" in c.risks[0]
    assert any("PTX JIT" in r for r in c.as_json()["reasons"])


def test_strict_choice_has_no_risk() -> None:
    assert choose_torch(driver="590.48.01", compute_caps=["9.0"], python="3.11").risks == ()


def test_mirror_index_is_used() -> None:
    c = choose_torch(driver="590.48.01", compute_caps=["9.0"], python="3.11",
                     index="https://mirrors.nju.edu.cn/pytorch/whl/")
    assert c.index_url == "https://mirrors.nju.edu.cn/pytorch/whl/cu130/"


def test_driver_max_cuda_from_table() -> None:
    d = load_compat()
    assert d.max_cuda_for_driver(dotted("550.54.14")) == (12, 4)
    assert d.max_cuda_for_driver(dotted("550.54.13")) == (12, 3)
    assert d.max_cuda_for_driver(dotted("590.48.01")) == (13, 1)
    assert d.max_cuda_for_driver(dotted("390.0")) is None


def test_torch_spec_forms() -> None:
    assert "2.5.1" in torch_spec("2.5") and "2.6.0" not in torch_spec("2.5")
    assert "2.5.0" in torch_spec("2.5.0") and "2.5.1" not in torch_spec("2.5.0")
    assert "2.5.1" in torch_spec(">=2.4,<2.6")
    with pytest.raises(ProvisionError, match="not valid"):
        torch_spec("two point five")


def test_every_minor_release_is_in_the_data() -> None:
    minors = {f"{r.version.major}.{r.version.minor}" for r in load_compat().releases}
    assert minors == {"1.11", "1.12", "1.13"} | {f"2.{i}" for i in range(15)}


def test_torchaudio_ends_at_2_11() -> None:
    rel = {str(r.version): r for r in load_compat().releases}
    assert rel["2.11.0"].torchaudio == "2.11.0"
    assert all(r.torchaudio is None for v, r in rel.items() if r.version.release >= (2, 12))


def run_pick(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from provision.cli.main import main; main()",
                           "pick", *args], capture_output=True, text=True)


def test_pick_json_interface() -> None:
    r = run_pick("--driver", "550.54.14", "--compute-cap", "8.6", "--python", "3.10",
                 "--torch", "2.3", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"torch", "torchvision", "torchaudio", "cuda", "index_url", "reasons"}
    assert data["torch"] == "2.3.1" and data["cuda"] == "cu121"
    assert data["torchvision"] == "0.18.1" and data["torchaudio"] == "2.3.1"
    assert data["index_url"] == "https://download.pytorch.org/whl/cu121/"
    assert isinstance(data["reasons"], list) and data["reasons"]


def test_pick_without_gpu_is_cpu_and_null_torchaudio() -> None:
    data = json.loads(run_pick("--python", "3.11", "--json").stdout)
    assert data["cuda"] == "cpu" and data["torchaudio"] is None


def test_pick_nothing_fits_exits_2_with_the_fix() -> None:
    r = run_pick("--driver", "550.54.14", "--compute-cap", "8.6,12.0", "--python", "3.10", "--json")
    assert r.returncode == 2
    assert "driver >= 570.26 allows torch 2.7+cu128, the first with sm_120" in r.stderr
    error = json.loads(r.stdout)  # --json: the failure is a JSON object too
    assert error["exit_code"] == 2 and set(error) == {"error", "exit_code"}
    assert "driver >= 570.26 allows torch 2.7+cu128, the first with sm_120" in error["error"]


def test_pick_glibc_and_minor_flags() -> None:
    r = run_pick("--driver", "550.144.03", "--compute-cap", "8.6", "--python", "3.10",
                 "--glibc", "2.17", "--cuda-compat", "minor", "--json")
    assert json.loads(r.stdout)["torch"] == "2.6.0"


def test_pick_text_explains() -> None:
    r = run_pick("--driver", "590.48.01", "--compute-cap", "9.0", "--python", "3.11")
    assert r.returncode == 0
    assert "torch 2.14.1+cu130" in r.stdout
    assert "pip install torch==2.14.1 torchvision==0.29.1 --index-url" in r.stdout
