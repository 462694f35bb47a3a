"""How fast is `sync up` against rsync and scp on the same link? A benchmark, not a test.

A 200 MB folder (four 50 MB files of random bytes and two small ones) goes to a CPU-only
sandbox host through a latency proxy (tests/sandbox/proxy.py LatencyProxy: each chunk arrives
half the round trip late, later chunks keep flowing) at each round-trip time. Each figure is the
median wall time of fresh runs into an empty folder, as a user runs them, start-up included:

    rsync -rt -e ssh SRC/ host:DEST/        the baseline
    scp -r SRC host:DEST
    gpu-provision sync up SRC --dest DEST   (rsync over our pinned SSH settings)
    gpu-provision sync up ... --transport sftp

Then a resumed transfer: the link is cut once half has arrived, and the second run's report says
how many bytes it sent.

Usage, as root in the checkout (sandbox hosts need root and Debian's sshd; rsync installed):

    .venv/bin/python bench/sync_speed.py [--runs 3] [--rtt 0,200] [--mb 200] [--write]

--write puts the figures into bench/RESULTS.md (section "sync up").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GPU_SANDBOX_DIR", "/tmp/gpu-bench")

from tests.sandbox import harness  # noqa: E402
from tests.sandbox.proxy import LatencyProxy, TcpProxy  # noqa: E402
from tests.sandbox.remote import ssh  # noqa: E402

BIN = Path(sys.executable).parent
WORK = Path(tempfile.mkdtemp(prefix="gpu-sync-speed-"))
ENV = {**os.environ, "GPU_PROVISION_HOME": str(WORK / "gp-home"), "COLUMNS": "200"}
MB = 1_000_000
SECTION = "## sync up: throughput against rsync and scp"


def make_folder(total_mb: int) -> Path:
    root = WORK / "dataset"
    (root / "shards").mkdir(parents=True)
    for i in range(4):
        with (root / "shards" / f"shard-{i}.bin").open("wb") as f:
            for _ in range(total_mb // 4):
                f.write(os.urandom(MB))
    (root / "labels.csv").write_text("".join(f"{i},{i % 7}\n" for i in range(1000)))
    (root / "readme.txt").write_text("a dataset\n")
    return root


def timed(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=WORK, env=ENV, timeout=1800)
    seconds = time.perf_counter() - started
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:5])}... exited {r.returncode}:\n{r.stdout[-1500:]}"
                         f"\n{r.stderr[-1500:]}")
    return seconds, r.stdout


def ssh_argv(info: harness.HostInfo, port: int) -> list[str]:
    return ["ssh", "-p", str(port), "-i", info.key, "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]


def run_tools(info: harness.HostInfo, src: Path, rtt: int, runs: int) -> dict[str, list[float]]:
    proxy = LatencyProxy((info.host, info.port), delay_ms=rtt)
    inv = info.inventory_with(WORK / f"via-{rtt}.yaml", host="127.0.0.1", port=proxy.port)
    s = ssh_argv(info, proxy.port)
    tools = {
        "rsync -e ssh": lambda d: ["rsync", "-rt", "-e", " ".join(s), f"{src}/",
                                   f"root@127.0.0.1:{d}/"],
        "scp -r": lambda d: ["scp", "-r", "-q", *s[3:], "-P", str(proxy.port), str(src),
                             f"root@127.0.0.1:{d}"],
        "gpu-provision sync up": lambda d: [str(BIN / "gpu-provision"), "-H", inv, "sync", "up",
                                            str(src), "--dest", d, "--json"],
        "gpu-provision sync up --transport sftp": lambda d: [
            str(BIN / "gpu-provision"), "-H", inv, "sync", "up", str(src), "--dest", d,
            "--transport", "sftp", "--json"],
    }
    out: dict[str, list[float]] = {k: [] for k in tools}
    # pinned beforehand, as after any first contact (the others trust any key, unpinned)
    timed([str(BIN / "gpu-provision"), "-H", inv, "repin"])
    try:
        for i in range(runs):
            for name, argv in tools.items():  # interleaved: load on the machine hits all alike
                dest = f"/root/bench-{i}"
                ssh(info, f"rm -rf {dest}")
                seconds, _ = timed(argv(dest))
                out[name].append(seconds)
                print(f"  {rtt:>3} ms  {name:<40} {seconds:7.2f} s", flush=True)
                ssh(info, f"rm -rf {dest}")
    finally:
        proxy.close()
    return out


def resumed(info: harness.HostInfo, src: Path, transport: str) -> dict[str, float]:
    """Cut the link once half has arrived; what the second run sends."""
    proxy = TcpProxy((info.host, info.port), delay_ms=2)
    inv = info.inventory_with(WORK / "cut.yaml", host="127.0.0.1", port=proxy.port)
    dest = f"/root/cut-{transport}"
    ssh(info, f"rm -rf {dest}")
    argv = [str(BIN / "gpu-provision"), "-H", inv, "sync", "up", str(src), "--dest", dest,
            "--transport", transport, "--json"]
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    landed = info.path(dest)
    proc = subprocess.Popen(argv, cwd=WORK, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def below() -> int:
        return sum(p.stat().st_size for p in landed.rglob("*") if p.is_file()) \
            if landed.exists() else 0
    while below() < total // 2 and proc.poll() is None:
        time.sleep(0.02)
    proxy.cut()
    proc.communicate()
    arrived = below()
    proxy.close()
    _, text = timed([*argv[:2], info.inventory, *argv[3:]])  # the same host, link mended
    report = json.loads(text)
    ssh(info, f"rm -rf {dest}")
    return {"total": total, "arrived": arrived, "sent": report["sent_bytes"],
            "resumed": report["resumed_bytes"]}


def table(results: dict[int, dict[str, list[float]]], mb: int, runs: int) -> str:
    rtts = sorted(results)
    lines = [f"Medians of {runs} fresh runs: wall seconds from start to exit (start-up, "
             f"listing and checks included), MB/s = {mb} MB / that time, and the median of "
             "each round's ratio to rsync's time in the same round (the tools take turns, so "
             "a busy spell on the machine falls on all of them).", "",
             "| | " + " | ".join(f"{r} ms RTT" for r in rtts) + " |",
             "|---|" + "---|" * len(rtts)]
    names = list(next(iter(results.values())))
    for name in names:
        cells = []
        for r in rtts:
            t = statistics.median(results[r][name])
            ratio = statistics.median(a / b for a, b in zip(results[r][name],
                                                            results[r]["rsync -e ssh"],
                                                            strict=True))
            cells.append(f"{t:.2f} s, {mb / t:.1f} MB/s ({ratio:.2f}x)")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rtt", default="0,200")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    if not shutil.which("rsync") or harness.why_unavailable():
        raise SystemExit(f"needs rsync and sandbox hosts: {harness.why_unavailable() or 'no rsync'}")
    info = harness.start("cpu-only")
    try:
        src = make_folder(a.mb)
        results = {}
        for rtt in (int(x) for x in a.rtt.split(",")):
            results[rtt] = run_tools(info, src, rtt, a.runs)
        cuts = {t: resumed(info, src, t) for t in ("rsync", "sftp")}
    finally:
        harness.stop(info.id)
        shutil.rmtree(WORK, ignore_errors=True)
    text = table(results, a.mb, a.runs)
    text += "\n\nA resumed transfer (the link cut once half had arrived, then the same command " \
            "again):\n\n| transport | arrived before the cut | the second run sent | " \
            "resumed from partial files | the rest was |\n|---|---|---|---|---|\n"
    for t, c in cuts.items():
        text += (f"| {t} | {c['arrived'] / MB:.1f} MB | {c['sent'] / MB:.1f} MB | "
                 f"{c['resumed'] / MB:.1f} MB | {(c['total'] - c['arrived']) / MB:.1f} MB |\n")
    print(text)
    if a.write:
        path = ROOT / "bench" / "RESULTS.md"
        old = path.read_text()
        before, _, rest = old.partition(SECTION)
        after = rest[rest.find("\n## "):] if "\n## " in rest else ""  # later sections stay
        stamp = (f"Measured {time.strftime('%Y-%m-%d')} by `bench/sync_speed.py --runs {a.runs}` "
                 f"on {os.cpu_count()} cores.")
        path.write_text(f"{before.rstrip()}\n\n{SECTION}\n\n{stamp}\n\n{text.rstrip()}\n{after}")


if __name__ == "__main__":
    main()
