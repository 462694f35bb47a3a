"""gpu-provision bench: the standard suite, run on the host in the provisioned env (torch only,
next to validate_gpu.py whose measuring helpers it shares). Needs no downloads but the bounded
mirror probes. Prints ONE line: a JSON object.

Argument 1 is a JSON config: {"data_dir": str|null, "mirrors": [{"kind", "url"}],
"download_mb": int, "download_timeout": seconds per mirror (default 20)}. Every figure is a number
or null (not measured, with the reason in
"notes"); "mode" says whether the GPU or the CPU ran the torch parts.

Suite (fixed, so reports from different hosts compare):
- matmul TFLOPS per dtype (fp32, tf32, fp16, bf16 where the GPU has them; CPU: fp32);
- device memory; device-memory and host-to-device bandwidth (validate_gpu.gpu_figures: each
  figure on GPU 0 itself, sustained, one that fails a note);
- training throughput of a small CNN on generated MNIST-shaped data (batch 128, SGD);
- inference latency of a small detection-sized conv net on generated 640x640 images, batch 1
  and 32;
- disk write and read speed in the data dir (256 MiB, fsync'd, read back past the page cache);
- CPU cores and host memory a job gets (in a container the cgroup's quota and limit, with
  nproc's and /proc/meminfo's beside them) and a single-core score;
- download speed from each configured mirror (at most download_mb MiB each).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.parse
import urllib.request
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import precision  # noqa: E402
import validate_gpu as vg  # noqa: E402


def cnn(torch: Any, device: Any, steps: int, batch: int = 128) -> float:
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                          nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    _sync(torch, device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(torch, device)
    return round(steps * batch / (time.perf_counter() - t0), 1)


def detector(torch: Any, device: Any, batch: int, iters: int) -> float:
    """Milliseconds per batch of a YOLO-sized (640x640, 255-channel head) conv net."""
    nn = torch.nn
    layers, c = [], 3
    for out in (16, 32, 64, 128, 256):
        layers += [nn.Conv2d(c, out, 3, stride=2, padding=1), nn.BatchNorm2d(out), nn.SiLU()]
        c = out
    model = nn.Sequential(*layers, nn.Conv2d(c, 255, 1)).to(device).eval()
    x = torch.randn(batch, 3, 640, 640, device=device)
    with torch.no_grad():
        for _ in range(3):  # cuDNN picks its kernels on the first calls: not timed
            model(x)
        _sync(torch, device)
        t0 = time.perf_counter()
        for _ in range(iters):
            model(x)
        _sync(torch, device)
    return round((time.perf_counter() - t0) / iters * 1000, 2)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def disk(path: str, mib: int = 256) -> tuple[float | None, float | None, str | None]:
    """MB/s writing ``mib`` MiB (fsync'd) and reading it back after dropping it from the cache."""
    f = os.path.join(path, f".gpu-provision-bench-{os.getpid()}")
    block = os.urandom(1048576)
    try:
        t0 = time.perf_counter()
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for _ in range(mib):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
        write = mib * 1.048576 / (time.perf_counter() - t0)
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        while os.read(fd, 4 * 1048576):
            pass
        os.close(fd)
        read = mib * 1.048576 / (time.perf_counter() - t0)
        return round(write, 1), round(read, 1), None
    except OSError as exc:
        return None, None, f"disk {path}: {exc}"
    finally:
        if os.path.exists(f):
            os.unlink(f)


def _precision(torch: Any) -> dict[str, Any]:
    precision.set_conv(torch, True)
    precision.set_fp32(torch, False)
    return {"conv": "tf32", "matmul": precision.fp32_mode(torch),
            "env": {k: v for k, v in precision.environment().items() if v is not None}}


def single_core(seconds: float = 0.5) -> float:
    """Millions of loop iterations per second of plain Python arithmetic (one core)."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x = 0
        for i in range(100000):
            x += i * i % 7
        n += 100000
    return round(n / (time.perf_counter() - t0) / 1e6, 2)


def _first_file(index_url: str, timeout: float) -> str:
    """The first file linked from a PEP 503 project page (the biggest thing a mirror serves)."""
    with urllib.request.urlopen(index_url, timeout=timeout) as r:
        page = r.read(2_000_000).decode("utf-8", "replace")
    m = re.search(r'href="([^"#]+\.(?:whl|tar\.gz|sh))', page)
    if not m:
        raise ValueError(f"no file linked from {index_url}")
    return str(urllib.parse.urljoin(index_url, m.group(1)))


def download(kind: str, url: str, mib: int, timeout: float = 20) -> dict[str, Any]:
    """MB/s of the first ``mib`` MiB of the mirror's file (a project page is followed to its
    first file)."""
    started = time.perf_counter()
    try:
        if not re.search(r"\.(whl|tar\.gz|sh)$", url):
            url = _first_file(url, timeout)
        req = urllib.request.Request(url, headers={"Range": f"bytes=0-{mib * 1048576 - 1}"})
        got, t0 = 0, time.perf_counter()
        with urllib.request.urlopen(req, timeout=timeout) as r:
            while got < mib * 1048576 and time.perf_counter() - started < timeout:
                chunk = r.read(1048576)
                if not chunk:
                    break
                got += len(chunk)
        secs = time.perf_counter() - t0
        return {"kind": kind, "url": url, "mb": round(got / 1e6, 1),
                "mbs": round(got / 1e6 / secs, 1) if secs > 0 else None, "error": None}
    except Exception as exc:  # a dead mirror is a figure (none), not a crash
        return {"kind": kind, "url": url, "mb": 0, "mbs": None, "error": f"{type(exc).__name__}: {exc}"}


def _guarded(notes: list[str], what: str, fn: Callable[[], Any]) -> Any:
    """One figure: its value, or None with the reason in the notes ("no kernel image", an OOM
    on a GPU someone else uses, an Xid) - the other figures still run."""
    try:
        return fn()
    except Exception as exc:
        notes.append(f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
        return None


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    notes: list[str] = []
    out: dict[str, Any] = {
        "schema": 2, "mode": "cpu", "torch": None, "cuda": None, "gpus": [], "tflops": {},
        "memory_gb": None, "mem_gbs": None, "h2d_gbs": None, "train_samples_s": None,
        "infer_ms_b1": None, "infer_ms_b32": None, "infer_images_s": None, "disk_write_mbs": None,
        "disk_read_mbs": None, "cpu_single_score": None, "downloads": [], "notes": notes}
    # what a job gets: in a container the cgroup's CPU quota and memory limit, not the machine's
    # nproc and /proc/meminfo (validate_gpu.host reads both and keeps the smaller)
    h = vg.host(None)
    out.update(cpu_cores=h["cpu_cores"], cpu_count=h["cpu_count"], cpu_quota=h["cpu_quota"],
               host_memory_gb=h["memory_gb"], meminfo_gb=h["meminfo_gb"],
               memory_limit_gb=h["memory_limit_gb"])
    out["cpu_single_score"] = _guarded(notes, "cpu single core", single_core)
    data_dir = cfg.get("data_dir") or os.path.expanduser("~")
    if not os.path.isdir(data_dir):
        notes.append(f"data dir {data_dir} does not exist: disk measured in the home dir")
        data_dir = os.path.expanduser("~")
    out["disk_write_mbs"], out["disk_read_mbs"], problem = disk(data_dir)
    out["disk_path"] = data_dir
    if problem:
        notes.append(problem)
    out["downloads"] = [download(m["kind"], m["url"], int(cfg.get("download_mb") or 50),
                                 int(cfg.get("download_timeout") or 20))
                        for m in cfg.get("mirrors") or []]
    try:
        import torch
    except Exception as exc:
        notes.append(f"import torch failed: {exc!r}: no torch figures")
        return out
    out.update(torch=torch.__version__, cuda=torch.version.cuda)
    gpu = bool(_guarded(notes, "cuda", lambda: torch.version.cuda is not None and torch.cuda.is_available()))
    dev = torch.device("cpu")
    steps, iters = 20, 2
    if gpu:
        out["mode"] = "gpu"
        dev = torch.device("cuda", 0)
        out["gpus"] = _guarded(notes, "gpu names", lambda: [torch.cuda.get_device_name(i) for i in
                                                            range(torch.cuda.device_count())]) or []
        props = _guarded(notes, "gpu 0 properties", lambda: torch.cuda.get_device_properties(0))
        if props is not None:
            out["memory_gb"] = round(props.total_memory / 1e9, 1)
            figs = _guarded(notes, "gpu 0 figures",
                            lambda: vg.gpu_figures(torch, 0, props.major, vg._uuid(props)))
            if figs:
                out["tflops"] = {k: v for k, v in figs["tflops"].items() if v is not None}
                out["mem_gbs"], out["h2d_gbs"] = figs["mem_gbs"], figs["h2d_gbs"]
                notes.extend(f"gpu 0 {n}" for n in figs["notes"])
        steps, iters = 200, 20
    else:
        notes.append("no usable GPU: the torch figures are the CPU's")
        cpu = _guarded(notes, "cpu matmul", lambda: vg.cpu_gflops(torch))
        if cpu is not None:
            out["tflops"]["fp32"] = round(cpu / 1000, 3)
    # the conv nets' precision said, not left to the image: torch's defaults (cuDNN in TF32, fp32
    # matmuls in IEEE), whatever the environment or a sitecustomize set (precision.py)
    out["precision"] = _guarded(notes, "precision", lambda: _precision(torch))
    out["train_samples_s"] = _guarded(notes, "train", lambda: cnn(torch, dev, steps))
    out["infer_ms_b1"] = _guarded(notes, "inference batch 1", lambda: detector(torch, dev, 1, iters * 2))
    out["infer_ms_b32"] = _guarded(notes, "inference batch 32", lambda: detector(torch, dev, 32, iters))
    if out["infer_ms_b32"]:
        out["infer_images_s"] = round(32 / out["infer_ms_b32"] * 1000, 1)
    return out


def main(argv: list[str]) -> None:
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    config = json.loads(argv[1]) if len(argv) > 1 else {}
    started = time.perf_counter()
    try:
        result = run(config)
    except Exception as exc:  # always one JSON line: the provisioner reads nothing else
        result = {"schema": 2, "mode": None, "tflops": {}, "downloads": [],
                  "notes": [f"bench_gpu.py stopped: {type(exc).__name__}: {exc}"[:500]]}
    result["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv)
