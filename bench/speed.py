"""How fast is the tool itself: start-up, the facts script on the host, one host over a long link,
and many hosts at once over it. A benchmark, not a test: it prints figures.

- start-up: `gpu-provision --version`, `-l` and `pick` (no host), from this venv and from the
  built wheel installed into a fresh venv (as users install it), beside `python -c pass`; the
  modules that cost most, from `python -X importtime`.
- facts script: `time bash facts.sh` on sandbox hosts (the script alone: what it costs the host).
- one link: over a TCP delay proxy (tests/sandbox/proxy.py) in front of a provisioned CPU-only
  sandbox host, at each round-trip time the median of fresh runs (a new process each, as a user
  runs them) of: bare `ssh host true`; `ssh host 'bash -s' < bench/checks.sh` (the read-only
  checks a re-run needs: the baseline); `gpu-provision facts`; a no-op `gpu-provision bootstrap`;
  the same checks as an Ansible playbook (bench/checks.yml) and as pyinfra facts
  (bench/checks_pyinfra.py).
- many hosts: 1, 4 and 16 sandbox hosts, each behind its own delay proxy, `facts` and a no-op
  `bootstrap` on all of them at once: wall time, and the laptop's CPU seconds per host (user +
  sys of our process, divided by the hosts).

The jobs section (``--only jobs``, or listed with the others in ``--only``) times `gpu-provision
run` (start a job and return) against `ssh host true` at each RTT, and the latency of `logs -f`:
from the moment a job wrote a line (its own clock; the sandbox host is this machine) to the
moment the reader printed it, median and 95th percentile.

The keep section (``--only keep``, bench/keep_speed.py) times commands through a warm keeper
(kept connections) against `ssh host true` at each RTT, the first command (which starts the
keeper), and `facts` on --hosts' largest count of hosts with warm keepers against one host.

Usage, as root in the checkout after `make test` (ansible-core and pyinfra are the `bench`
extra; they are installed into .venv when missing):

    .venv/bin/python bench/speed.py [--runs 5] [--rtt 0,200] [--hosts 1,4,16] [--many-rtt 200]
                                    [--only startup,script,links,many,jobs,keep] [--no-others]
                                    [--write]

--write adds the figures, the machine and the date to bench/RESULTS.md as a new section above
the earlier ones (which stay); the prose on targets is written by hand.

The cold bootstrap, alone (it is not part of the run above):

    .venv/bin/python bench/speed.py --cold cpu-only,h200 [--runs 3]

For each profile, --runs rounds of two fresh sandbox hosts brought to a validated env task by
task (conda, env, torch, then bootstrap for validation): one whose PyPI mirror has no uv (the
torch and packages steps fall back to pip), one with uv; then, on the uv host, a bare
`uv pip install` of the same requirements into a fresh env with uv's cache emptied. It prints
each step's seconds (as the tool reports them), the bytes the mirror sent for it, the load
average during the round, and the medians; the raw figures go to cold.json in its work dir.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GPU_SANDBOX_DIR", "/tmp/gpu-bench")

from tests.sandbox import harness  # noqa: E402
from tests.sandbox.proxy import TcpProxy  # noqa: E402

BIN = Path(sys.executable).parent
WORK = Path(tempfile.mkdtemp(prefix="gpu-speed-"))
# as installed: an installed wheel has its bytecode compiled (pip does it), so Python's start
# reads .pyc files; PYTHONDONTWRITEBYTECODE (set on some build machines) would make every run
# compile the program from source again
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
       "GPU_PROVISION_HOME": str(WORK / "gp-home"), "COLUMNS": "200",
       "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_PIPELINING": "True",
       "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1"}
SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
PICK = ["pick", "--driver", "550.54.14", "--compute-cap", "8.9"]


def run_timed(argv: list[str], stdin: str | None = None, env: dict[str, str] | None = None,
              ok: tuple[int, ...] = (0,)) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children: user + sys)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=WORK,
                       env=env or ENV, timeout=900)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[:4])}... exited {r.returncode}:\n{r.stdout[-1500:]}"
                         f"\n{r.stderr[-1500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu


def timed(argv: list[str], **kw: Any) -> float:
    return run_timed(argv, **kw)[0]


def median(argv_fn: Callable[[int], list[str]], runs: int, **kw: Any) -> float:
    return statistics.median(timed(argv_fn(i), **kw) for i in range(runs))


def medians(argv: list[str], runs: int, **kw: Any) -> dict[str, float]:
    """Median and min wall seconds and median CPU seconds of ``runs`` fresh runs."""
    xs = [run_timed(argv, **kw) for _ in range(runs)]
    return {"wall": statistics.median(x[0] for x in xs), "min": min(x[0] for x in xs),
            "cpu": statistics.median(x[1] for x in xs)}


def ensure_bench_tools() -> None:
    if not (BIN / "ansible-playbook").exists() or not (BIN / "pyinfra").exists():
        print("installing the bench extra (ansible-core, pyinfra) into", BIN.parent)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{ROOT}[bench]"],
                       check=True)


# -- start-up -------------------------------------------------------------------------------

def wheel_venv() -> Path:
    """The built wheel installed into a fresh venv: the program as `pip install` gives it
    (no editable-install import hook)."""
    venv = WORK / "wheel-venv"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(WORK / "dist"), str(ROOT)], check=True, cwd=WORK)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    [whl] = (WORK / "dist").glob("gpu_provision-*.whl")
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(whl)], check=True)
    return venv / "bin"


def top_imports(python: str, argv: list[str], n: int = 6) -> list[tuple[str, float]]:
    """The top-level modules costing most (cumulative ms) in ``python -X importtime``."""
    r = subprocess.run([python, "-X", "importtime", "-m", "provision", *argv], cwd=WORK,
                       capture_output=True, text=True, env=ENV)
    costs: dict[str, float] = {}
    for line in r.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", line)  # not indented: top level
        if m:
            costs[m.group(2)] = costs.get(m.group(2), 0) + int(m.group(1)) / 1000
    return sorted(costs.items(), key=lambda kv: -kv[1])[:n]


def startup(runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, bindir in (("wheel venv", wheel_venv()), ("editable (checkout)", BIN)):
        python, program = str(bindir / "python"), str(bindir / "gpu-provision")
        out[label] = {
            "python -c pass": medians([python, "-c", "pass"], runs),
            "gpu-provision --version": medians([program, "--version"], runs),
            "gpu-provision -l": medians([program, "-l"], runs),
            "gpu-provision pick": medians([program, *PICK], runs),
            "gpu-provision pick --json": medians([program, *PICK, "--json"], runs),
            "imports of pick": top_imports(python, PICK),
        }
    return out


# -- the facts script on the host -----------------------------------------------------------

def ssh_argv(info: harness.HostInfo, port: int | None = None, host: str | None = None) -> list[str]:
    return ["ssh", "-i", info.key, "-p", str(port or info.port), *SSH_OPTS,
            f"root@{host or info.host}"]


def facts_script_alone(infos: list[harness.HostInfo], runs: int) -> dict[str, dict[str, float]]:
    """`time bash facts.sh` on each host: the script's own wall and CPU seconds there."""
    from provision.config.recipes import all_platforms
    from provision.facts.gather import data_dirs, facts_script
    platforms = all_platforms()
    script = facts_script(platforms, data_dirs(platforms))
    out = {}
    for info in infos:
        ssh = ssh_argv(info)
        subprocess.run([*ssh, "cat > /tmp/facts.sh"], input=script, text=True, check=True)
        subprocess.run([*ssh, "bash /tmp/facts.sh >/dev/null"], check=True)  # warm caches
        real, cpu = [], []
        for _ in range(runs):
            r = subprocess.run([*ssh, "TIMEFORMAT='%R %U %S'; { time bash /tmp/facts.sh "
                                      ">/dev/null; } 2>&1"], capture_output=True, text=True,
                               check=True)
            wall, user, sys_ = map(float, r.stdout.split()[-3:])
            real.append(wall)
            cpu.append(user + sys_)
        out[info.profile] = {"wall": statistics.median(real), "min": min(real),
                             "cpu": statistics.median(cpu)}
    return out


# -- one host over a long link --------------------------------------------------------------

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


def one_link(info: harness.HostInfo, rtt: int, runs: int, others: bool) -> dict[str, dict[str, float]]:
    proxy = TcpProxy((info.host, info.port), delay_ms=rtt)
    try:
        inv = info.inventory_with(WORK / f"via-{rtt}ms.yaml", host="127.0.0.1", port=proxy.port)
        ssh = ssh_argv(info, proxy.port, "127.0.0.1")
        checks = (ROOT / "bench" / "checks.sh").read_text()
        timed([str(BIN / "gpu-provision"), "-H", inv, "facts"])  # pins the key (first use)
        out = {
            "ssh true": medians([*ssh, "true"], runs),
            "ssh bash -s < checks.sh": medians([*ssh, "bash -s"], runs, stdin=checks),
            "gpu-provision facts": medians(
                [str(BIN / "gpu-provision"), "-H", inv, "facts", "--json"], runs),
            "gpu-provision bootstrap (no-op)": medians(
                [str(BIN / "gpu-provision"), "-H", inv, "bootstrap"], runs),
        }
        if others:
            ini = WORK / f"ansible-{rtt}.ini"
            ini.write_text(f"box ansible_host=127.0.0.1 ansible_port={proxy.port} "
                           f"ansible_user=root ansible_ssh_private_key_file={info.key} "
                           "ansible_python_interpreter=/usr/bin/python3\n")
            pyinv = WORK / f"pyinfra_inv_{rtt}.py"
            pyinv.write_text(f"hosts = [('127.0.0.1', {{'ssh_port': {proxy.port}, 'ssh_user': "
                             f"'root', 'ssh_key': {info.key!r}, 'ssh_strict_host_key_checking': "
                             "'off', 'ssh_known_hosts_file': '/dev/null'})]\n")
            out["ansible-playbook checks.yml"] = medians(
                [str(BIN / "ansible-playbook"), "-i", str(ini), str(ROOT / "bench" / "checks.yml")],
                runs, env={**ENV, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(WORK / f"cp-{rtt}-{time.time()}")})
            out["pyinfra checks_pyinfra.py"] = medians(
                [str(BIN / "pyinfra"), "-y", str(pyinv), str(ROOT / "bench" / "checks_pyinfra.py")],
                runs)
        return out
    finally:
        proxy.close()


# -- many hosts over a long link ------------------------------------------------------------

def many(infos: list[harness.HostInfo], counts: list[int], rtt: int,
         runs: int) -> dict[int, dict[str, dict[str, float]]]:
    """Each host behind its own delay proxy; every count runs at once (GPU_PROVISION_PARALLEL
    left at its default)."""
    proxies = [TcpProxy((i.host, i.port), delay_ms=rtt) for i in infos]
    try:
        invs = [i.inventory_with(WORK / f"many-{rtt}-{i.id}.yaml", host="127.0.0.1", port=p.port)
                for i, p in zip(infos, proxies, strict=True)]
        timed([str(BIN / "gpu-provision"), "-H", ",".join(invs), "facts", "--json"])  # pins
        out: dict[int, dict[str, dict[str, float]]] = {}
        for n in counts:
            hosts = ",".join(invs[:n])
            out[n] = {}
            for task in ("facts", "bootstrap"):
                row = medians([str(BIN / "gpu-provision"), "-H", hosts, task], runs)
                row["cpu_per_host"] = row["cpu"] / n
                out[n][task] = row
        return out
    finally:
        for p in proxies:
            p.close()


# -- report ---------------------------------------------------------------------------------

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
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, Python {sys.version.split()[0]}, "
            f"load average {load:.1f} at the start")


def report(results: dict[str, Any], runs: int) -> str:
    lines: list[str] = []
    if "startup" in results:
        lines += [f"Start-up, no host (median of {runs} fresh runs; min; CPU user+sys), seconds:", "",
                  "| command | " + " | ".join(results["startup"]) + " |",
                  "|---|" + "---|" * len(results["startup"])]
        names = [k for k in next(iter(results["startup"].values())) if k != "imports of pick"]
        for name in names:
            cells = [f"{v[name]['wall']:.3f} (min {v[name]['min']:.3f}; CPU {v[name]['cpu']:.3f})"
                     for v in results["startup"].values()]
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
        for label, v in results["startup"].items():
            lines.append("")
            lines.append(f"Imports of `pick` ({label}, cumulative ms, `-X importtime`): " +
                         ", ".join(f"{m} {ms:.0f}" for m, ms in v["imports of pick"]))
        lines.append("")
    if "script" in results:
        lines += [f"The facts script alone on the host (`time bash facts.sh`, median of {runs}), "
                  "seconds:", "", "| host | wall | min | CPU |", "|---|---|---|---|"]
        for prof, v in results["script"].items():
            lines.append(f"| {prof} | {v['wall']:.3f} | {v['min']:.3f} | {v['cpu']:.3f} |")
        lines.append("")
    if "links" in results:
        links = results["links"]
        rtts = sorted(links, key=int)
        base = "ssh bash -s < checks.sh"
        lines += [f"One host (median of {runs} fresh runs), seconds (ratio to `{base}`; to "
                  "`ssh true`; laptop CPU):", "",
                  "| | " + " | ".join(f"{r} ms RTT" for r in rtts) + " |",
                  "|---|" + "---|" * len(rtts)]
        for name in links[rtts[0]]:
            cells = [f"{links[r][name]['wall']:.2f} ({links[r][name]['wall'] / links[r][base]['wall']:.2f}x; "
                     f"{links[r][name]['wall'] / links[r]['ssh true']['wall']:.2f}x; "
                     f"CPU {links[r][name]['cpu']:.2f})" for r in rtts]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if "many" in results:
        par, rtt = results["many"], results["many_rtt"]
        counts = sorted(par, key=int)
        one = par[counts[0]]
        lines += [f"Several hosts at once at {rtt} ms RTT, each behind its own proxy (median of "
                  f"{max(1, runs // 2)}), wall seconds (ratio to one host; laptop CPU per host):",
                  "", "| hosts | facts | bootstrap (no-op) |", "|---|---|---|"]
        for n in counts:
            cells = [f"{par[n][t]['wall']:.2f} ({par[n][t]['wall'] / one[t]['wall']:.2f}x; "
                     f"{par[n][t]['cpu_per_host']:.3f} s/host)" for t in ("facts", "bootstrap")]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- The cold bootstrap: a fresh host to a validated env, pip against uv ----------------------

COLD_TORCH = {"cpu-only": None, "h200": "2.14"}  # the torch spec each profile installs


def cold_work() -> Path:
    """The cold section's own folder, under this session's sandbox dir (a shared /tmp may be
    swept by others' clean-ups during a run this long)."""
    work = harness.sandbox_dir() / "cold-bench"
    work.mkdir(parents=True, exist_ok=True)
    return work


def task(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)
         ) -> tuple[float, dict[str, float], int]:
    """(wall seconds, each applied step's seconds as the tool reports them, mirror bytes sent)
    of one gpu-provision run."""
    from tests.sandbox import mirror
    since = mirror.log_offset()
    started = time.perf_counter()
    r = subprocess.run([str(BIN / "gpu-provision"), *argv, "--json"], capture_output=True,
                       text=True, cwd=cold_work(), env=env, timeout=1800)
    wall = time.perf_counter() - started
    if r.returncode not in ok:
        raise SystemExit(f"gpu-provision {' '.join(argv)} exited {r.returncode}:\n"
                         f"{r.stdout[-2500:]}\n{r.stderr[-2500:]}")
    done = json.loads(r.stdout)
    steps = {x["step"]: float(x["seconds"]) for x in done.get("steps", []) if x["result"] == "ok"}
    return wall, steps, mirror.bytes_served(since)[0]


def ssh_run(info: harness.HostInfo, command: str) -> float:
    """Seconds of one ``ssh host COMMAND`` (a user typing it), which must succeed."""
    ssh = ["ssh", "-i", info.key, "-p", str(info.port), *SSH_OPTS, f"root@{info.host}"]
    started = time.perf_counter()
    r = subprocess.run([*ssh, command], capture_output=True, text=True, cwd=cold_work(),
                       timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"ssh {info.id} {command!r} exited {r.returncode}:\n{r.stdout[-1500:]}"
                         f"\n{r.stderr[-1500:]}")
    return time.perf_counter() - started


def warm_mirror(profile: str) -> None:
    """Fetch every wheel a profile's torch install needs through the mirror once, untimed: files
    from the upstream index are then kept by the mirror and local ones sit in the page cache,
    so neither the internet nor the first read from disk lands in one installer's figure."""
    from provision.ops.installer import load_uv
    from tests.sandbox import mirror
    m = mirror.ensure()
    variant, reqs = ("cu130", ["torch==2.14.1", "torchvision==0.29.1"]) if profile == "h200" \
        else ("cpu", ["torch==2.13.0"])
    dest = cold_work() / f"warm-{profile}"
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "-q", "-d", str(dest),
                    "--index-url", f"{m['pytorch']}/{variant}/", *reqs], check=True,
                   capture_output=True, timeout=1800)
    subprocess.run([sys.executable, "-m", "pip", "download", "--isolated", "-q", "--no-deps",
                    "-d", str(dest), "--index-url", f"{m['pypi']}/",
                    f"uv=={load_uv().version}"], check=True, capture_output=True, timeout=600)
    shutil.rmtree(dest, ignore_errors=True)


def cold_host(profile: str, installer: str, bare: bool) -> dict[str, Any]:
    """One cold bootstrap of a fresh ``profile`` host, task by task (conda, env, torch with the
    recipe's packages, then bootstrap, which has only validation left), with ``installer``:
    "pip" serves the host a PyPI mirror without uv (the fallback), "uv" the mirror as it is.
    ``bare``: then the same torch requirements again on that host, by a bare ``uv pip install``
    into a fresh env with uv's cache emptied."""
    from tests.sandbox import mirror
    info = harness.start(profile)
    try:
        import yaml
        inv_text = yaml.safe_load(Path(info.inventory).read_text())
        pypi = mirror.overlay("no-uv", hide=["uv"]) if installer == "pip" else info.mirror["pypi"]
        # a new host may reuse an earlier one's id and address: its own name and pinned key
        name = f"{info.id}-{installer}-{time.time_ns()}"
        env = {**ENV, "GPU_PROVISION_HOME": str(cold_work() / f"gp-{name}")}
        inv = info.inventory_with(cold_work() / f"{name}.yaml",
                                  mirrors={**inv_text["mirrors"], "pypi": pypi})
        spec = ["--torch", COLD_TORCH[profile]] if COLD_TORCH[profile] else []
        plan = json.loads(subprocess.run(
            [str(BIN / "gpu-provision"), "-H", inv, "plan", "--json", *spec], cwd=cold_work(),
            env=env,
            capture_output=True, text=True, timeout=300, check=True).stdout)
        load = [os.getloadavg()[0]]
        out: dict[str, Any] = {"profile": profile, "installer": installer, "steps": {},
                               "bytes": {}, "wall": {}}
        for name, argv, ok in (("conda", ["conda"], (0,)), ("env", ["env"], (0,)),
                               ("torch", ["torch", *spec], (0,)),
                               ("validate", ["bootstrap", *spec], (0, 1))):
            wall, steps, sent = task(["-H", inv, *argv], env, ok)
            out["wall"][name] = wall
            out["bytes"][name] = sent
            out["steps"].update(steps)
            load.append(os.getloadavg()[0])
        log = info.path("/root/.gpu-provision/logs/torch.log").read_text()
        # the install command alone: the last progress line, printed when it ended
        out["install"] = float(re.findall(r"^received \d+ MiB in ([\d.]+)s", log, re.MULTILINE)[-1])
        used = re.search(r"^installer: (uv|pip)\b", log, re.MULTILINE)
        if not used or used.group(1) != installer:
            raise SystemExit(f"{info.id}: the torch step did not install with {installer}: "
                             f"{used.group(0) if used else 'no installer line'}")
        if bare:
            choice, settings = plan["torch"], plan["settings"]
            reqs = [f"torch=={choice['torch']}"]
            if settings["domain_libraries"]:
                reqs += [f"{k}=={choice[k]}" for k in ("torchvision", "torchaudio") if choice[k]]
            uv = f"/root/.gpu-provision/tools/uv-{load_uv_version()}/uv"
            ssh_run(info, "rm -rf /root/.cache/uv && /root/miniconda3/bin/conda create -y -q "
                          f"-n bare python={settings['python']} >/dev/null")
            since = mirror.log_offset()
            out["bare_uv"] = ssh_run(info, f"{uv} pip install --python "
                                           "/root/miniconda3/envs/bare/bin/python "
                                           f"{' '.join(reqs)} --index-url {choice['index_url']}")
            out["bare_bytes"] = mirror.bytes_served(since)[0]
            out["bare_command"] = f"uv pip install --python <fresh env> {' '.join(reqs)} " \
                                  f"--index-url <mirror>/pytorch/{choice['cuda']}/"
            load.append(os.getloadavg()[0])
        out["load"] = load
        return out
    finally:
        harness.stop(info.id)


def load_uv_version() -> str:
    from provision.ops.installer import load_uv
    return load_uv().version


def cold_bootstrap(profiles: list[str], runs: int) -> dict[str, list[dict[str, Any]]]:
    """``runs`` rounds per profile of a pip host and a uv host (then the bare uv install on the
    uv host), the order alternating between rounds so that neither always goes first."""
    results: dict[str, list[dict[str, Any]]] = {}
    for profile in profiles:
        print(f"cold bootstrap, {profile}: warming the mirror ...", flush=True)
        warm_mirror(profile)
        results[profile] = []
        for i in range(runs):
            for installer in (("pip", "uv") if i % 2 == 0 else ("uv", "pip")):
                print(f"cold bootstrap, {profile}, round {i + 1}/{runs}: {installer} ...",
                      flush=True)
                results[profile].append(cold_host(profile, installer, bare=installer == "uv"))
                # kept as it grows: a failure late in a long run loses nothing measured before
                (cold_work() / "cold.json").write_text(json.dumps(results, indent=1))
    return results


def cold_report(results: dict[str, list[dict[str, Any]]]) -> str:
    med = statistics.median
    lines = ["| host | installer | conda | env | torch step | torch bytes | packages | validate "
             "| 1-min load (min-max) |", "|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for profile, rows in results.items():
        by = {k: [r for r in rows if r["installer"] == k] for k in ("pip", "uv")}
        for k, rs in by.items():
            def step(name: str, rs: list[dict[str, Any]] = rs) -> str:
                vals = [r["steps"][name] for r in rs if name in r["steps"]]
                return f"{med(vals):.1f} s" if vals else "-"
            loads = [x for r in rs for x in r["load"]]
            lines.append(f"| {profile} | {k} | {step('conda')} | {step('env')} | {step('torch')} "
                         f"| {med(r['bytes']['torch'] for r in rs) / 2**20:.0f} MiB "
                         f"| {step('packages')} | {step('validate')} "
                         f"| {min(loads):.1f}-{max(loads):.1f} |")
        pip_t = med(r["steps"]["torch"] for r in by["pip"])
        uv_t = med(r["steps"]["torch"] for r in by["uv"])
        bare = med(r["bare_uv"] for r in by["uv"])
        ratios.append((profile, pip_t, uv_t, bare, by["uv"][0]["bare_command"],
                       med(r["bare_bytes"] for r in by["uv"]),
                       [round(r["steps"]["torch"], 1) for r in by["pip"]],
                       [round(r["steps"]["torch"], 1) for r in by["uv"]],
                       [round(r["bare_uv"], 1) for r in by["uv"]]))
    lines += ["", "| host | pip torch step | uv torch step | pip / uv (target >= 2x) "
              "| bare `uv pip install` | our uv step / bare (target <= 1.2x) "
              "| its install command alone / bare |", "|---|---|---|---|---|---|---|"]
    for profile, pip_t, uv_t, bare, _, _, pips, uvs, bares in ratios:
        inst = med(r["install"] for r in results[profile] if r["installer"] == "uv")
        lines.append(f"| {profile} | {pip_t:.1f} s {pips} | {uv_t:.1f} s {uvs} "
                     f"| {pip_t / uv_t:.2f}x | {bare:.1f} s {bares} | {uv_t / bare:.2f}x "
                     f"| {inst:.1f} s, {inst / bare:.2f}x |")
    lines += ["", "Bare commands, on the uv host after our steps, uv's cache emptied:"]
    lines += [f"- {p}: `{cmd}` ({sent / 2**20:.0f} MiB from the mirror)"
              for p, _, _, _, cmd, sent, *_ in ratios]
    return "\n".join(lines)


def keep_section(infos: list[harness.HostInfo], rtts: list[int], runs: int, hosts: int,
                 many_rtt: int) -> str:
    from bench.keep_speed import keep_link, keep_many, keep_report
    gp = str(BIN / "gpu-provision")
    links = {}
    for rtt in rtts:
        print(f"measuring kept connections at {rtt} ms RTT ...", flush=True)
        links[rtt] = keep_link(infos[0], rtt, runs, gp, ssh_argv(infos[0]), ENV, WORK, timed)
    many_row = None
    if hosts > 1:
        while len(infos) < hosts:
            infos.append(harness.start("cpu-only"))
        print(f"measuring {hosts} hosts' facts with warm keepers at {many_rtt} ms ...", flush=True)
        many_row = keep_many(infos[:hosts], many_rtt, runs, gp, ENV, WORK, timed)
    print(json.dumps({"keep": links, "keep_many": many_row}))
    return keep_report(links, many_row, many_rtt, runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtt", default="0,200")
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--many-rtt", type=int, default=200)
    ap.add_argument("--only", default="startup,script,links,many",
                    help="sections to measure; jobs (run and logs -f over the delay proxy) and "
                         "keep (commands through a warm keeper, bench/keep_speed.py) are extra")
    ap.add_argument("--no-others", action="store_true", help="skip Ansible and pyinfra")
    ap.add_argument("--write", action="store_true", help="add a section to bench/RESULTS.md")
    ap.add_argument("--cold", metavar="PROFILES", help="only the cold bootstrap, pip against uv, "
                    "on these sandbox profiles (cpu-only,h200); --runs rounds each")
    a = ap.parse_args()
    if a.cold:
        problem = harness.why_unavailable()
        if problem:
            raise SystemExit(f"sandbox hosts unavailable: {problem}")
        started = time.time()
        cold = cold_bootstrap(a.cold.split(","), a.runs)
        print(cold_report(cold))
        print(json.dumps(cold))
        (cold_work() / "cold.json").write_text(json.dumps(cold, indent=1))
        print(f"cold bootstrap measured in {time.time() - started:.0f} s on {machine()}; "
              f"figures in {cold_work() / 'cold.json'}")
        return
    only = set(a.only.split(","))
    # the bytecode an install would have compiled (see ENV)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "provision")],
                   env=ENV, check=True)
    started, header = time.time(), machine()
    results: dict[str, Any] = {}
    if "startup" in only:
        print("measuring start-up ...", flush=True)
        results["startup"] = startup(max(a.runs, 10))
    if only & {"script", "links", "many", "jobs", "keep"}:
        problem = harness.why_unavailable()
        if problem:
            raise SystemExit(f"sandbox hosts unavailable: {problem}")
        if "links" in only and not a.no_others:
            ensure_bench_tools()
        counts = [int(x) for x in a.hosts.split(",") if x]
        infos = [harness.start("cpu-only")]
        try:
            if "script" in only:
                print("measuring the facts script on the hosts ...", flush=True)
                gpu = harness.start("ubuntu-22.04-rtx4090")
                results["script"] = facts_script_alone([infos[0], gpu], a.runs)
                harness.stop(gpu.id)
            if only & {"links", "many", "jobs", "keep"}:
                print(f"provisioning the bench host {infos[0].id} ...", flush=True)
                provisioned(infos[0])
            if "jobs" in only:
                results["jobs"] = jobs_section(infos[0], [int(x) for x in a.rtt.split(",")], a.runs)
            if "keep" in only:
                results["keep"] = keep_section(infos, [int(x) for x in a.rtt.split(",")], a.runs,
                                               max(counts or [1]), a.many_rtt)
            if "links" in only:
                results["links"] = {}
                for rtt in (int(x) for x in a.rtt.split(",")):
                    print(f"measuring at {rtt} ms RTT ...", flush=True)
                    results["links"][rtt] = one_link(infos[0], rtt, a.runs, not a.no_others)
            if "many" in only and counts:
                for _ in range(max(counts) - 1):
                    infos.append(harness.start("cpu-only"))
                    clone_home(infos[0], infos[-1])
                # each clone validates once (a new host: its own boot), so the timed runs are no-ops
                timed([str(BIN / "gpu-provision"), "-H", ",".join(i.inventory for i in infos),
                       "bootstrap"])
                print(f"measuring {counts} hosts at once at {a.many_rtt} ms RTT ...", flush=True)
                results["many"] = many(infos, counts, a.many_rtt, max(1, a.runs // 2))
                results["many_rtt"] = a.many_rtt
        finally:
            harness.stop_all()
    text = report(results, a.runs) + (f"\n\n### Jobs\n\n{results['jobs']}" if "jobs" in results else "")
    text += f"\n\n### Kept connections\n\n{results['keep']}" if "keep" in results else ""
    print(text)
    print(json.dumps(results, default=str))
    if a.write:
        args = " ".join(sys.argv[1:])
        section = (f"\n## {time.strftime('%Y-%m-%d %H:%M')}: `bench/speed.py {args}`\n\n"
                   f"{time.time() - started:.0f} s on {header}.\n\n{text}\n")
        path = ROOT / "bench" / "RESULTS.md"
        intro, sep, earlier = path.read_text().partition("\n## ")  # newest first
        path.write_text(intro.rstrip("\n") + "\n" + section + (sep + earlier if sep else ""))


if __name__ == "__main__":
    main()
