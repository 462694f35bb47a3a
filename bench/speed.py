"""How fast is the tool itself over a long link? A benchmark, not a test: it prints figures.

Over a TCP delay proxy (tests/sandbox/proxy.py) in front of a provisioned CPU-only sandbox host,
at each round-trip time it takes the median of fresh runs (a new process each, as a user runs
them) of: bare `ssh host true`; `ssh host 'bash -s' < bench/checks.sh` (the read-only checks a
re-run needs: the baseline); `gpu-provision facts`; a no-op `gpu-provision bootstrap`; the same
checks as an Ansible playbook (bench/checks.yml) and as pyinfra facts (bench/checks_pyinfra.py).
Then no-op bootstraps of 1, 4 and 16 sandbox hosts at once.

Usage, as root in the checkout after `make test` (ansible-core and pyinfra are the `bench`
extra; they are installed into .venv when missing):

    .venv/bin/python bench/speed.py [--runs 5] [--rtt 0,50,200] [--hosts 1,4,16] [--write]

--write puts the figures, the machine and the date into bench/RESULTS.md.

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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


# --- The cold bootstrap: a fresh host to a validated env, pip against uv ----------------------

COLD_TORCH = {"cpu-only": None, "h200": "2.14"}  # the torch spec each profile installs
STEP_ROW = re.compile(r"[│|]\s*(\w+)\s*[│|]\s*(ok|skipped|failed)\s*[│|]\s*([\d.]+)\s*[│|]")


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
    r = subprocess.run([str(BIN / "gpu-provision"), *argv], capture_output=True, text=True,
                       cwd=cold_work(), env=env, timeout=1800)
    wall = time.perf_counter() - started
    if r.returncode not in ok:
        raise SystemExit(f"gpu-provision {' '.join(argv)} exited {r.returncode}:\n"
                         f"{r.stdout[-2500:]}\n{r.stderr[-2500:]}")
    steps = {m.group(1): float(m.group(3)) for m in STEP_ROW.finditer(r.stdout)
             if m.group(2) == "ok"}
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rtt", default="0,50,200")
    ap.add_argument("--hosts", default="1,4,16")
    ap.add_argument("--write", action="store_true", help="write bench/RESULTS.md")
    ap.add_argument("--cold", metavar="PROFILES", help="only the cold bootstrap, pip against uv, "
                    "on these sandbox profiles (cpu-only,h200); --runs rounds each")
    a = ap.parse_args()
    problem = harness.why_unavailable()
    if problem:
        raise SystemExit(f"sandbox hosts unavailable: {problem}")
    if a.cold:
        started = time.time()
        cold = cold_bootstrap(a.cold.split(","), a.runs)
        text = cold_report(cold)
        print(text)
        print(json.dumps(cold))
        (cold_work() / "cold.json").write_text(json.dumps(cold, indent=1))
        print(f"cold bootstrap measured in {time.time() - started:.0f} s on {machine()}; "
              f"figures in {cold_work() / 'cold.json'}")
        return
    ensure_bench_tools()
    counts = [int(x) for x in a.hosts.split(",") if x]
    started = time.time()
    infos = [harness.start("cpu-only")]
    try:
        print(f"provisioning the bench host {infos[0].id} ...", flush=True)
        provisioned(infos[0])
        links = {}
        for rtt in (int(x) for x in a.rtt.split(",")):
            print(f"measuring at {rtt} ms RTT ...", flush=True)
            links[rtt] = one_link(infos[0], rtt, a.runs)
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


if __name__ == "__main__":
    main()
