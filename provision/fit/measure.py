"""``fit --measure``: peak GPU memory at a few small batch sizes, fitted to memory = a + b x
batch, and the target batch predicted with its error.

The arithmetic is here (pure); the run on the host is templates/fit/measure.sh.j2, which
starts the user's command once per batch size with a startup hook (measure_hook.py, put first
on PYTHONPATH as ``sitecustomize``) that writes torch.cuda.max_memory_allocated and
max_memory_reserved at exit, while nvidia-smi is sampled for the process's peak.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.shipped import templates_dir
from ..errors import ProvisionError, UsageError
from ..ops.step import Outcome, Step, dict_result, inputs_hash
from ..remote.contract import shown
from ..remote.templating import render

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Point:
    batch: int
    gb: float  # peak, GiB


@dataclass(frozen=True)
class Line:
    """memory = a + b x batch, fitted by least squares."""

    a: float
    b: float
    points: tuple[Point, ...]

    def at(self, batch: float) -> float:
        return self.a + self.b * batch

    def error(self, batch: float) -> float | None:
        """The standard error of a prediction at ``batch`` (ordinary least squares: s x
        sqrt(1 + 1/n + (x - mean)^2 / Sxx)); None with two points, which any line passes
        through exactly."""
        n = len(self.points)
        if n < 3:
            return None
        xs = [p.batch for p in self.points]
        mean = sum(xs) / n
        sxx = sum((x - mean) ** 2 for x in xs)
        rss = sum((p.gb - self.at(p.batch)) ** 2 for p in self.points)
        s = math.sqrt(rss / (n - 2))
        return s * math.sqrt(1 + 1 / n + (batch - mean) ** 2 / sxx)


def fit_line(points: Sequence[Point]) -> Line:
    """Least squares through ``points`` (at least two different batch sizes)."""
    if len({p.batch for p in points}) < 2:
        raise ProvisionError("fit --measure: peaks at two different batch sizes are needed to "
                             f"fit a line; got {len(points)} usable run(s)")
    n = len(points)
    mx = sum(p.batch for p in points) / n
    my = sum(p.gb for p in points) / n
    sxx = sum((p.batch - mx) ** 2 for p in points)
    b = sum((p.batch - mx) * (p.gb - my) for p in points) / sxx
    return Line(a=my - b * mx, b=b, points=tuple(points))


def batch_sizes(text: str) -> tuple[int, ...]:
    """``--measure-batches 1,2,4`` -> (1, 2, 4): two or three different sizes above 0."""
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--measure-batches {text}: write two or three sizes, e.g. 1,2,4") \
            from None
    if not 2 <= len(set(sizes)) <= 3 or len(set(sizes)) != len(sizes) or min(sizes) < 1:
        raise UsageError(f"--measure-batches {text}: two or three different sizes above 0, "
                         "e.g. 1,2,4")
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class Run:
    """What the host reported for one batch size."""

    batch: int
    rc: int
    torch_allocated_gb: float | None  # torch.cuda.max_memory_allocated, every device summed
    torch_reserved_gb: float | None
    smi_peak_gb: float | None  # the largest memory.used nvidia-smi showed for the process tree
    tail: str  # the command's last output lines


def read_runs(result: Mapping[str, Any]) -> tuple[bool, list[Run]]:
    """measure.sh.j2's report: {"gpu": bool, "runs": [{batch, rc, allocated_bytes,
    reserved_bytes, smi_peak_mib, tail}]}."""
    runs = []
    for r in result.get("runs") or []:
        alloc, res, smi = r.get("allocated_bytes"), r.get("reserved_bytes"), r.get("smi_peak_mib")
        runs.append(Run(batch=int(r["batch"]), rc=int(r.get("rc", 0)),
                        torch_allocated_gb=alloc / GIB if alloc is not None else None,
                        torch_reserved_gb=res / GIB if res is not None else None,
                        smi_peak_gb=smi * MIB / GIB if smi is not None else None,
                        tail=str(r.get("tail") or "")))
    return bool(result.get("gpu")), runs


@dataclass(frozen=True)
class Prediction:
    target: int
    source: str  # "nvidia-smi" or "torch"
    line: Line
    gb: float
    error_gb: float | None

    def as_json(self) -> dict[str, Any]:
        return {"batch": self.target, "source": self.source, "a_gb": round(self.line.a, 3),
                "b_gb_per_sample": round(self.line.b, 4), "predicted_gb": round(self.gb, 2),
                "error_gb": round(self.error_gb, 2) if self.error_gb is not None else None,
                "points": [{"batch": p.batch, "gb": round(p.gb, 3)} for p in self.line.points]}


def predict(runs: Sequence[Run], target: int) -> list[Prediction]:
    """A line per measure that has two batch sizes or more: nvidia-smi's peak (what the card
    must hold: context and allocator reserve included) first, then torch's allocated peak."""
    out = []
    ran = [r for r in runs if r.rc in (0, 124)]  # 124: stopped at --measure-seconds; it counts
    for source, peaks in (("nvidia-smi", [(r.batch, r.smi_peak_gb) for r in ran]),
                          ("torch", [(r.batch, r.torch_allocated_gb) for r in ran])):
        pts = [Point(b, v) for b, v in peaks if v is not None]
        if len({p.batch for p in pts}) >= 2:
            line = fit_line(pts)
            out.append(Prediction(target, source, line, line.at(target), line.error(target)))
    if not out:
        failed = [r for r in runs if r.rc not in (0, 124)]
        why = (f"batch {failed[0].batch} exited {failed[0].rc}: "
               f"{failed[0].tail.strip().splitlines()[-1] if failed[0].tail.strip() else ''}"
               if failed else "no run reported a peak (does the command use torch on the GPU?)")
        raise ProvisionError(f"fit --measure: no line could be fitted; {why}")
    return out


HOOK_DIR = shown("measure-hook")


def check_command(argv: Sequence[str], batch_env: str | None) -> None:
    """The command must be given, and must take the batch size somewhere."""
    if not argv:
        raise UsageError("fit --measure: give the command after --, with {batch} where the batch "
                         "size goes (-- python train.py --batch-size {batch} --max-steps 5)")
    if batch_env is None and not any("{batch}" in w for w in argv):
        raise UsageError("fit --measure: the command must take the batch size: write {batch} "
                         "where it goes (--batch-size {batch}), or name the environment "
                         "variable your script reads with --batch-env")
    if batch_env is not None and not batch_env.replace("_", "a").isalnum():
        raise UsageError(f"--batch-env {batch_env}: a variable name (letters, digits, _)")


def needs_gpu(host: str, gpus: int) -> None:
    """On a host without an NVIDIA GPU there is nothing to measure."""
    if gpus == 0:
        raise ProvisionError(f"{host}: fit --measure needs a GPU and nvidia-smi sees none on "
                             "this host; without one, `gpu-provision fit` (no -H) estimates "
                             "the memory offline")


def measure_step(argv: Sequence[str], batches: Sequence[int], python_bin: str, env_bin: str,
                 batch_env: str | None, seconds: int, workdir: str | None) -> Step:
    """The step that runs the command once per batch size on the host (templates/fit/)."""
    config = {"argv": list(argv), "batches": list(batches), "env_var": batch_env,
              "seconds": seconds, "hook_dir": HOOK_DIR, "path": env_bin, "workdir": workdir}
    body = render("fit/measure.sh.j2", python_bin=python_bin,
                  hook=(templates_dir() / "fit" / "measure_hook.py").read_text(),
                  runner=(templates_dir() / "fit" / "measure_run.py").read_text(),
                  config=json.dumps(config, sort_keys=True))
    sizes = ", ".join(str(b) for b in batches)
    return Step("measure", f"{' '.join(argv)} at batch {sizes}, at most {seconds} s each",
                action=f"run the command at batch {sizes}", body=body,
                inputs=inputs_hash(config=config), read=read_measure)


def read_measure(result: Any) -> Outcome:
    return Outcome(data=dict_result(result, "measure"))
