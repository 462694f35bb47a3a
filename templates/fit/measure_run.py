"""Run a command at a few batch sizes and report each run's peak GPU memory (for
``gpu-provision fit --measure``). Argument 1 is JSON: {"argv": [...], "batches": [1, 2, 4],
"env_var": "BATCH_SIZE", "seconds": 300, "hook_dir": "~/...", "workdir": "...", "path": "..."}.

Per batch size: ``{batch}`` in the words of argv is replaced by the size, and env_var (when
given) is set to it; the command runs with the hook directory first on PYTHONPATH (its
sitecustomize reports torch's peaks); nvidia-smi's memory.used is sampled every 0.2 s and the
peak above what each GPU held before the run is kept (process ids inside a container are not
the ones nvidia-smi lists, so the rise of the whole GPU is what is measured). A run still going
after ``seconds`` gets SIGTERM (then SIGKILL 10 s later): a few steps are all it needs.
Prints {"gpu": bool, "runs": [{batch, rc, allocated_bytes, reserved_bytes, smi_peak_mib,
tail, seconds}]}.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def used_mib() -> list[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return [int(x.strip()) for x in out.stdout.split("\n") if x.strip()]
    except ValueError:
        return None


class Sampler(threading.Thread):
    def __init__(self, base: list[int]) -> None:
        super().__init__(daemon=True)
        self.base, self.peak, self.stop = base, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            now = used_mib()
            if now:
                self.peak = max([self.peak, *(u - b for u, b in zip(now, self.base))])
            self.stop.wait(0.2)


def one_run(cfg: dict, batch: int, out_dir: str) -> dict:
    argv = [w.replace("{batch}", str(batch)) for w in cfg["argv"]]
    stem = os.path.join(out_dir, f"peak-{batch}")
    env = dict(os.environ)
    env["PYTHONPATH"] = cfg["hook_dir"] + (os.pathsep + env["PYTHONPATH"]
                                           if env.get("PYTHONPATH") else "")
    env["GPU_PROVISION_MEASURE_OUT"] = stem
    env["PYTHONUNBUFFERED"] = "1"
    if cfg.get("path"):
        env["PATH"] = cfg["path"] + os.pathsep + env.get("PATH", "")
    if cfg.get("env_var"):
        env[cfg["env_var"]] = str(batch)
    base = used_mib()
    sampler = Sampler(base) if base else None
    if sampler:
        sampler.start()
    log = os.path.join(out_dir, f"run-{batch}.log")
    started = time.monotonic()
    with open(log, "wb") as f:
        try:
            proc = subprocess.Popen(argv, cwd=cfg.get("workdir") or None, env=env, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            f.write(f"cannot start {argv[0]}: {exc}\n".encode())
            proc = None
        rc = 127
        if proc is not None:
            try:
                rc = proc.wait(timeout=cfg["seconds"])
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                rc = 124  # stopped at the time limit, as coreutils' timeout says
    if sampler:
        sampler.stop.set()
        sampler.join()
    allocated = reserved = None
    for path in glob.glob(stem + ".*"):
        if path.endswith(".tmp"):
            continue
        with open(path) as f:
            peaks = json.load(f)
        if peaks.get("allocated"):
            allocated = max(allocated or 0, max(peaks["allocated"]))
            reserved = max(reserved or 0, max(peaks["reserved"]))
    with open(log, "rb") as f:
        tail = f.read()[-2000:].decode("utf-8", "replace")
    return {"batch": batch, "rc": rc, "allocated_bytes": allocated, "reserved_bytes": reserved,
            # no rise at all: the run ended between two samples (a GPU process holds at least
            # its CUDA context), so nvidia-smi has nothing to say about it
            "smi_peak_mib": sampler.peak if sampler and sampler.peak > 0 else None, "tail": tail,
            "seconds": round(time.monotonic() - started, 1)}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    home = os.path.expanduser("~")
    for key in ("hook_dir", "path", "workdir"):
        if cfg.get(key):  # ~ and relative paths are the home's, as `run --workdir` takes them
            cfg[key] = os.path.join(home, os.path.expanduser(cfg[key]))
    gpu = bool(shutil.which("nvidia-smi")) and bool(used_mib())
    out_dir = tempfile.mkdtemp(prefix="gpu-provision-measure-")
    runs = [] if not gpu else [one_run(cfg, b, out_dir) for b in cfg["batches"]]
    shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps({"gpu": gpu, "runs": runs}))


if __name__ == "__main__":
    main()
