"""How fast is the tool itself over a long link? A benchmark, not a test: it prints figures.

Over a TCP delay proxy (tests/sandbox/proxy.py) in front of a provisioned CPU-only sandbox host,
at each round-trip time it takes the median of fresh runs (a new process each, as a user runs
them) of: bare `ssh host true`; `ssh host 'bash -s' < bench/checks.sh` (the read-only checks a
re-run needs: the baseline); `gpu-provision facts`; a no-op `gpu-provision bootstrap`; the same
checks as an Ansible playbook (bench/checks.yml) and as pyinfra facts (bench/checks_pyinfra.py).
Then no-op bootstraps of 1, 4 and 16 sandbox hosts at once.

The jobs section (``--jobs``, or ``--jobs-only`` alone) times `gpu-provision run` (start a job and
return) against `ssh host true` at each RTT, and the latency of `logs -f`: from the moment a job
wrote a line (its own clock; the sandbox host is this machine) to the moment the reader printed
it, median and 95th percentile.

Usage, as root in the checkout after `make test` (ansible-core and pyinfra are the `bench`
extra; they are installed into .venv when missing):

    .venv/bin/python bench/speed.py [--runs 5] [--rtt 0,50,200] [--hosts 1,4,16] [--jobs] [--write]
    .venv/bin/python bench/speed.py --jobs-only [--runs 9] [--rtt 0,200] [--write]

--write puts the figures, the machine and the date into bench/RESULTS.md (--jobs-only rewrites
only its own section there).
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
from tests.sandbox.proxy import TcpProxy  # noqa: E402

BIN = Path(sys.executable).parent
WORK = Path(tempfile.mkdtemp(prefix="gpu-speed-"))
ENV = {**os.environ, "GPU_PROVISION_HOME": str(WORK / "gp-home"), "COLUMNS": "200",
       "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_PIPELINING": "True",
       "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1"}
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]


def timed(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
          ok: tuple[int, ...] = (0,)) -> float:
    started = time.perf_counter()
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=WORK,
                       env=env or ENV, timeout=600)
    seconds = time.perf_counter() - started
    if r.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[:4])}... exited {r.returncode}:\n{r.stdout[-1500:]}"
                         f"\n{r.stderr[-1500:]}")
    return seconds


def median(argv_fn, runs: int, **kw) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(timed(argv_fn(i), **kw) for i in range(runs))


def ensure_bench_tools() -> None:
    if not (BIN / "ansible-playbook").exists() or not (BIN / "pyinfra").exists():
        print("installing the bench extra (ansible-core, pyinfra) into", BIN.parent)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[bench]"],
                       check=True)


def provisioned(info: harness.HostInfo) -> None:
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", info.inventory, "bootstrap"], cwd=WORK,
                       env=ENV, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"bootstrap of the bench host failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def clone_home(src: harness.HostInfo, dst: harness.HostInfo) -> None:
    """A provisioned /root for ``dst``: Miniconda and the env as hard links (nothing is written
    by a no-op run), our state and config copied."""
    a, b = src.path("/root"), dst.path("/root")
    subprocess.run(["cp", "-al", str(a / "miniconda3"), str(b / "miniconda3")], check=True)
    for rel in (".gpu-provision", ".condarc", ".config"):
        if (a / rel).exists():
            subprocess.run(["cp", "-a", str(a / rel), str(b / rel)], check=True)
    shutil.rmtree(b / ".gpu-provision" / "logs", ignore_errors=True)


def one_link(info: harness.HostInfo, rtt: int, runs: int) -> dict[str, float]:
    proxy = TcpProxy((info.host, info.port), delay_ms=rtt)
    try:
        inv = info.inventory_with(WORK / f"via-{rtt}ms.yaml", host="127.0.0.1", port=proxy.port)
        ssh = ["ssh", "-i", info.key, "-p", str(proxy.port), *SSH_OPTS, "root@127.0.0.1"]
        checks = (ROOT / "bench" / "checks.sh").read_text()
        ini = WORK / f"ansible-{rtt}.ini"
        ini.write_text(f"box ansible_host=127.0.0.1 ansible_port={proxy.port} ansible_user=root "
                       f"ansible_ssh_private_key_file={info.key} "
                       "ansible_python_interpreter=/usr/bin/python3\n")
        pyinv = WORK / f"pyinfra_inv_{rtt}.py"
        pyinv.write_text(f"hosts = [('127.0.0.1', {{'ssh_port': {proxy.port}, 'ssh_user': 'root', "
                         f"'ssh_key': {info.key!r}, 'ssh_strict_host_key_checking': 'off', "
                         "'ssh_known_hosts_file': '/dev/null'})]\n")
        timed([str(BIN / "gpu-provision"), "-H", inv, "facts"])  # pins the key (first use)
        out = {
            "ssh true": median(lambda i: [*ssh, "true"], runs),
            "ssh bash -s < checks.sh": median(lambda i: [*ssh, "bash -s"], runs, stdin=checks),
            "gpu-provision facts": median(
                lambda i: [str(BIN / "gpu-provision"), "-H", inv, "facts", "--json"], runs),
            "gpu-provision bootstrap (no-op)": median(
                lambda i: [str(BIN / "gpu-provision"), "-H", inv, "bootstrap"], runs),
            "ansible-playbook checks.yml": median(
                lambda i: [str(BIN / "ansible-playbook"), "-i", str(ini),
                           str(ROOT / "bench" / "checks.yml")], runs,
                env={**ENV, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(WORK / f"cp-{rtt}-{time.time()}")}),
            "pyinfra checks_pyinfra.py": median(
                lambda i: [str(BIN / "pyinfra"), "-y", str(pyinv),
                           str(ROOT / "bench" / "checks_pyinfra.py")], runs),
        }
        return out
    finally:
        proxy.close()


def many(infos: list[harness.HostInfo], counts: list[int], runs: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for n in counts:
        hosts = ",".join(i.inventory for i in infos[:n])
        env = {**ENV, "GPU_PROVISION_PARALLEL": str(n)}
        out[n] = {task: median(lambda i, h=hosts, t=task: [str(BIN / "gpu-provision"), "-H", h, t],
                               runs, env=env) for task in ("facts", "bootstrap")}
    return out


LINES = ("import sys, time\nfor i in range(int(sys.argv[1])):\n"
         "    print(f'{time.time():.6f} {i}', flush=True); time.sleep(float(sys.argv[2]))\n")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def logs_latency(inv: str, lines: int = 60, every: float = 0.25) -> list[float]:
    """Seconds from a line's write on the host to its print by `logs -f` here, for each line."""
    r = subprocess.run([str(BIN / "gpu-provision"), "-H", inv, "run", "--json", "--", "python",
                        "-c", LINES, str(lines), str(every)], cwd=WORK, env=ENV,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"run failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    job = json.loads(r.stdout)["id"]
    proc = subprocess.Popen([str(BIN / "gpu-provision"), "-H", inv, "logs", job, "-f", "--all"],
                            cwd=WORK, env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    delays = []
    first = 0.0
    for line in proc.stdout:
        at = time.time()
        first = first or at
        written, _, i = line.partition(" ")
        # the lines written before the reader connected come in its first burst: no latency
        if i.strip().isdigit() and at - first > 0.1:
            delays.append(at - float(written))
    proc.wait(timeout=60)
    return delays


def jobs_link(info: harness.HostInfo, rtt: int, runs: int) -> dict[str, float]:
    proxy = TcpProxy((info.host, info.port), delay_ms=rtt)
    try:
        inv = info.inventory_with(WORK / f"jobs-{rtt}ms.yaml", host="127.0.0.1", port=proxy.port)
        ssh = ["ssh", "-i", info.key, "-p", str(proxy.port), *SSH_OPTS, "root@127.0.0.1"]
        timed([str(BIN / "gpu-provision"), "-H", inv, "jobs"])  # pins the key (first use)
        gp = str(BIN / "gpu-provision")
        argvs = {"ssh true": lambda i: [*ssh, "true"],
                 "gpu-provision facts": lambda i: [gp, "-H", inv, "facts", "--json"],
                 "gpu-provision run": lambda i: [gp, "-H", inv, "run", "--name", f"bench{rtt}x{i}",
                                                 "--", "true"]}
        # interleaved, so a change in the machine's load weighs on each the same
        times: dict[str, list[float]] = {k: [] for k in argvs}
        for i in range(runs):
            for name, argv in argvs.items():
                times[name].append(timed(argv(i)))
        out = {k: statistics.median(v) for k, v in times.items()}
        delays = logs_latency(inv)
        out["logs -f median"] = statistics.median(delays)
        out["logs -f p95"] = percentile(delays, 0.95)
        out["logs -f lines"] = float(len(delays))
        return out
    finally:
        proxy.close()


def jobs_report(links: dict[int, dict[str, float]], runs: int) -> str:
    rtts = sorted(links)
    lines = [f"`run` (start a job detached on the host and return; `facts`, one remote execution "
             f"of the same tool, for comparison): medians of {runs} fresh runs, "
             "seconds (ratio to `ssh host true`). `logs -f`: seconds from a line written on the "
             f"host to its print here, over {int(links[rtts[0]]['logs -f lines'])} lines written "
             "every 0.25 s.", "",
             "| | " + " | ".join(f"{r} ms RTT" for r in rtts) + " |", "|---|" + "---|" * len(rtts)]
    for name in ("ssh true", "gpu-provision facts", "gpu-provision run"):
        lines.append(f"| {name} | " + " | ".join(
            f"{links[r][name]:.2f} ({links[r][name] / links[r]['ssh true']:.2f}x)" for r in rtts)
            + " |")
    for name in ("logs -f median", "logs -f p95"):
        lines.append(f"| {name.replace('logs -f ', '`logs -f` latency, ')} | " +
                     " | ".join(f"{links[r][name]:.2f}" for r in rtts) + " |")
    worst = max(links[r]["gpu-provision run"] / links[r]["ssh true"] for r in rtts)
    at200 = links.get(200)
    lines += ["", "| target | result | met |", "|---|---|---|"]
    if at200:
        ratio = at200["gpu-provision run"] / at200["ssh true"]
        lines.append(f"| `run` within 1.5x of `ssh true` at 200 ms RTT | {ratio:.2f}x "
                     f"(worst over the RTTs measured: {worst:.2f}x) | {'yes' if ratio < 1.5 else 'no'} |")
    return "\n".join(lines)


def write_section(title: str, text: str) -> None:
    """Replace (or add, before the targets) one `## title` section of RESULTS.md."""
    path = ROOT / "bench" / "RESULTS.md"
    doc = path.read_text() if path.exists() else "# Speed of gpu-provision\n"
    block = f"## {title}\n\n{text}\n\n"
    head, sep, rest = doc.partition(f"## {title}\n")
    if sep:
        nxt = rest.find("\n## ")
        doc = head + block + (rest[nxt + 1:] if nxt >= 0 else "")
    elif "## Targets" in doc:
        at = doc.index("## Targets")
        doc = doc[:at] + block + doc[at:]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block
    path.write_text(doc.rstrip("\n") + "\n")


def jobs_section(info: harness.HostInfo, rtts: list[int], runs: int) -> str:
    links = {}
    loads = [os.getloadavg()[0]]
    for rtt in rtts:
        print(f"jobs at {rtt} ms RTT ...", flush=True)
        links[rtt] = jobs_link(info, rtt, runs)
        loads.append(os.getloadavg()[0])
    text = jobs_report(links, runs) + (
        f"\n\nThe machine's 1-minute load average while this ran: {min(loads):.1f}-{max(loads):.1f} "
        f"on {os.cpu_count()} cores (the tool's Python start-up slows with it; ssh barely does).")
    print(text)
    print(json.dumps({"jobs": links}))
    return text


def machine() -> str:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "?")
    mem = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                   if ln.startswith("MemTotal"))) / 1048576
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {sys.version.split()[0]}"


def report(links: dict[int, dict[str, float]], par: dict[int, dict[str, float]], runs: int) -> str:
    rtts = sorted(links)
    names = list(links[rtts[0]])
    lines = [f"Medians of {runs} fresh runs, seconds (ratio to `ssh bash -s < checks.sh`).", "",
             "| | " + " | ".join(f"{r} ms RTT" for r in rtts) + " |",
             "|---|" + "---|" * len(rtts)]
    for name in names:
        cells = [f"{links[r][name]:.2f} ({links[r][name] / links[r]['ssh bash -s < checks.sh']:.2f}x)"
                 for r in rtts]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Against the others (their time / gpu-provision's no-op bootstrap):", "",
              "| | " + " | ".join(f"{r} ms" for r in rtts) + " |", "|---|" + "---|" * len(rtts)]
    for other in ("ansible-playbook checks.yml", "pyinfra checks_pyinfra.py"):
        lines.append(f"| {other} | " + " | ".join(
            f"{links[r][other] / links[r]['gpu-provision bootstrap (no-op)']:.1f}x" for r in rtts) + " |")
    if par:
        counts = sorted(par)
        lines += ["", "Several hosts at once (0 ms RTT), wall seconds (ratio to one host):", "",
                  "| hosts | facts | bootstrap (no-op) |", "|---|---|---|"]
        for n in counts:
            lines.append(f"| {n} | {par[n]['facts']:.2f} ({par[n]['facts'] / par[counts[0]]['facts']:.2f}x) "
                         f"| {par[n]['bootstrap']:.2f} "
                         f"({par[n]['bootstrap'] / par[counts[0]]['bootstrap']:.2f}x) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtt", default="0,50,200")
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    ap.add_argument("--jobs", action="store_true", help="also the jobs section (run, logs -f)")
    ap.add_argument("--jobs-only", action="store_true", help="only the jobs section")
    a = ap.parse_args()
    problem = harness.why_unavailable()
    if problem:
        raise SystemExit(f"sandbox hosts unavailable: {problem}")
    rtts = [int(x) for x in a.rtt.split(",")]
    if a.jobs_only:
        started = time.time()
        info = harness.start("cpu-only")
        try:
            print(f"provisioning the bench host {info.id} ...", flush=True)
            provisioned(info)
            text = jobs_section(info, rtts, a.runs)
        finally:
            harness.stop_all()
        if a.write:
            write_section("Jobs", f"Measured {time.strftime('%Y-%m-%d')} by `bench/speed.py "
                          f"--jobs-only --runs {a.runs} --rtt {a.rtt}` in "
                          f"{time.time() - started:.0f} s on {machine()}, over the same TCP "
                          f"delay proxy.\n\n{text}")
        return
    ensure_bench_tools()
    counts = [int(x) for x in a.hosts.split(",") if x]
    started = time.time()
    infos = [harness.start("cpu-only")]
    try:
        print(f"provisioning the bench host {infos[0].id} ...", flush=True)
        provisioned(infos[0])
        links = {}
        for rtt in rtts:
            print(f"measuring at {rtt} ms RTT ...", flush=True)
            links[rtt] = one_link(infos[0], rtt, a.runs)
        jobs_text = jobs_section(infos[0], rtts, a.runs) if a.jobs else ""
        par: dict[int, dict[str, float]] = {}
        if counts and max(counts) > 1:
            for _ in range(max(counts) - 1):
                infos.append(harness.start("cpu-only"))
                clone_home(infos[0], infos[-1])
            for info in infos:  # pin every key once, outside the timing
                timed([str(BIN / "gpu-provision"), "-H", info.inventory, "facts", "--json"])
            # each clone validates once (a new host: its own boot), so the timed runs are no-ops
            timed([str(BIN / "gpu-provision"), "-H", ",".join(i.inventory for i in infos),
                   "bootstrap"], env={**ENV, "GPU_PROVISION_PARALLEL": str(len(infos))})
            print(f"measuring {counts} hosts at once ...", flush=True)
            par = many(infos, counts, max(1, a.runs // 2))
    finally:
        harness.stop_all()
    text = report(links, par, a.runs)
    print(text)
    print(json.dumps({"links": links, "parallel": par}))
    if a.write:
        head = (f"# Speed of gpu-provision\n\nMeasured {time.strftime('%Y-%m-%d')} by "
                f"`bench/speed.py --runs {a.runs}` in {time.time() - started:.0f} s on {machine()}.\n"
                "Sandbox hosts are real OpenSSH servers on 127.0.0.x; the round-trip time is added "
                "by a TCP proxy that holds each chunk for half the RTT in each direction.\n\n")
        (ROOT / "bench" / "RESULTS.md").write_text(head + text + "\n")
        if jobs_text:
            write_section("Jobs", jobs_text)


if __name__ == "__main__":
    main()
