"""Kept connections (provision/remote/keep.py) over the delay proxy: what a command costs when
its host's keeper is warm, against bare `ssh host true` in the same rounds. Run through
``bench/speed.py --only keep`` (it provisions the host first: a no-op bootstrap, `logs JOB`,
`watch --once` need the env).

For each RTT, rounds of (interleaved, so the machine's load weighs on each the same):
- `ssh true` (a fresh OpenSSH connection each time);
- the first command: `facts --json` with no keeper (it starts one and is served by it);
- `facts --json --no-keep` (a fresh paramiko connection, as before keepers);
- with the keeper warm: `facts --json`, `jobs --json`, a no-op `bootstrap`, `watch --once
  --json`, `cost --json`, `logs JOB`, each served by the warm start (provision/cli/warm.py:
  the program loaded once, a worker forked per command); and `facts --json`, `jobs --json`
  with the warm start off ($GPU_PROVISION_WARM=0: the program loads in each command);
- the link alone: connect, run `true`, close, timed inside one process (no start-up), fresh and
  through a warm keeper.
Then, at --many-rtt, `facts` on 16 hosts (each behind its own proxy) with their keepers warm,
against one host with its keeper warm.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.sandbox import harness
from tests.sandbox.proxy import TcpProxy


def _env(env: dict[str, str], work: Path, keep: int) -> dict[str, str]:
    return {**env, "GPU_PROVISION_KEEP": str(keep), "GPU_PROVISION_RUN_DIR": str(work / "k")}


# one connect + `true` + close inside one process, fresh and kept: the link's share of a
# command without the program's start-up (which the CLI rows above carry)
LINK_ONLY = """
import json, statistics, sys, time
from pathlib import Path
from provision.config.inventory import load_inventory
from provision.remote.command import Command
from provision.remote.connection import connect
from provision.remote.executor import Executor
target = load_inventory(Path(sys.argv[1]))
c = connect(target); c.close()  # the keeper is warm (or keeping is off)
xs = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    c = connect(target)
    Executor(c, "bench").run(Command(("true",)), step="true")
    c.close()
    xs.append(time.perf_counter() - t)
print(json.dumps(statistics.median(xs)))
"""


def link_only(inv: str, runs: int, env: dict[str, str], work: Path) -> float:
    r = subprocess.run([sys.executable, "-c", LINK_ONLY, inv, str(max(runs, 5))], env=env,
                       cwd=work, capture_output=True, text=True, timeout=600, check=True)
    return float(json.loads(r.stdout))


def keep_link(info: harness.HostInfo, rtt: int, runs: int, gp: str, ssh_argv: list[str],
              env: dict[str, str], work: Path, timed: Any) -> dict[str, float]:
    proxy = TcpProxy((info.host, info.port), delay_ms=rtt)
    kept, fresh = _env(env, work, 600), _env(env, work, 0)
    try:
        inv = info.inventory_with(work / f"keep-{rtt}ms.yaml", host="127.0.0.1", port=proxy.port)
        ssh = [*ssh_argv[:4], str(proxy.port), *ssh_argv[5:-1], "root@127.0.0.1"]
        host = [gp, "-H", inv]
        timed([*host, "facts"], env=fresh)  # pins the key (first use)
        r = subprocess.run([*host, "run", "--json", "--", "echo", "a line"], env=fresh,
                           capture_output=True, text=True, cwd=work, timeout=300)
        job = json.loads(r.stdout)["id"]
        warm = {"facts --json": ["facts", "--json"], "jobs --json": ["jobs", "--json"],
                "bootstrap (no-op)": ["bootstrap"], "watch --once --json": ["watch", "--once",
                                                                            "--json"],
                "cost --json": ["cost", "--json"], "logs JOB": ["logs", job]}
        times: dict[str, list[float]] = {"ssh true": [], "first facts (starts the keeper)": [],
                                         "facts --no-keep": []}
        times |= {f"{k} (kept)": [] for k in warm}
        cold = {"facts --json (kept, warm start off)": ["facts", "--json"],
                "jobs --json (kept, warm start off)": ["jobs", "--json"]}
        times |= {k: [] for k in cold}
        for _ in range(runs):
            times["ssh true"].append(timed([*ssh, "true"]))
            harness.stop_keepers(work / "k")
            times["first facts (starts the keeper)"].append(timed([*host, "facts", "--json"],
                                                                  env=kept))
            times["facts --no-keep"].append(timed([*host, "facts", "--json"], env=fresh))
            harness.wait_until(lambda: list((work / "k").glob("w-*")), "the warm start",
                               timeout=30)
            for name, argv in warm.items():
                times[f"{name} (kept)"].append(timed([*host, *argv], env=kept))
            for name, argv in cold.items():
                times[name].append(timed([*host, *argv], env={**kept, "GPU_PROVISION_WARM": "0"}))
        out = {k: statistics.median(v) for k, v in times.items()}
        out["link only, fresh (in one process)"] = link_only(inv, runs, fresh, work)
        out["link only, kept (in one process)"] = link_only(inv, runs, kept, work)
        return out
    finally:
        harness.stop_keepers(work / "k")
        proxy.close()


def keep_many(infos: list[harness.HostInfo], rtt: int, runs: int, gp: str, env: dict[str, str],
              work: Path, timed: Any) -> dict[str, float]:
    proxies = [TcpProxy((i.host, i.port), delay_ms=rtt) for i in infos]
    kept = _env(env, work, 600)
    try:
        invs = [i.inventory_with(work / f"keep-many-{i.id}.yaml", host="127.0.0.1", port=p.port)
                for i, p in zip(infos, proxies, strict=True)]
        timed([gp, "-H", ",".join(invs), "facts", "--json"], env=kept)  # pins, starts keepers
        one, all_, jobs_one, jobs_all = [], [], [], []
        for _ in range(runs):
            one.append(timed([gp, "-H", invs[0], "facts", "--json"], env=kept))
            all_.append(timed([gp, "-H", ",".join(invs), "facts", "--json"], env=kept))
            # a command whose host side is cheap: what the fan-out itself costs, without 16
            # facts scripts (0.4 s of CPU each) sharing this machine's cores with us
            jobs_one.append(timed([gp, "-H", invs[0], "jobs", "--json"], env=kept))
            jobs_all.append(timed([gp, "-H", ",".join(invs), "jobs", "--json"], env=kept))
        return {"hosts": float(len(infos)), "one host (kept)": statistics.median(one),
                "all hosts (kept)": statistics.median(all_),
                "jobs, one host (kept)": statistics.median(jobs_one),
                "jobs, all hosts (kept)": statistics.median(jobs_all)}
    finally:
        harness.stop_keepers(work / "k")
        for p in proxies:
            p.close()


TARGETS = {"facts --json (kept)": 0.3, "jobs --json (kept)": 0.3, "bootstrap (no-op) (kept)": 0.4,
           "watch --once --json (kept)": 0.4, "cost --json (kept)": 0.4, "logs JOB (kept)": 0.4,
           "first facts (starts the keeper)": 1.1}


def keep_report(links: dict[int, dict[str, float]], many: dict[str, float] | None,
                many_rtt: int, runs: int) -> str:
    rtts = sorted(links)
    lines = [f"Medians of {runs} rounds, seconds (and x `ssh true` of the same rounds):", "",
             "| command | " + " | ".join(f"{r} ms RTT" for r in rtts) + " |",
             "|---|" + "---|" * len(rtts)]
    for name in links[rtts[0]]:
        lines.append(f"| {name} | " + " | ".join(
            f"{links[r][name]:.2f} ({links[r][name] / links[r]['ssh true']:.2f}x)"
            for r in rtts) + " |")
    lines += ["", "| target | result | met |", "|---|---|---|"]
    if 200 in links:
        at = links[200]
        for name, limit in TARGETS.items():
            ratio = at[name] / at["ssh true"]
            lines.append(f"| {name} at 200 ms <= {limit}x `ssh true` | {ratio:.2f}x | "
                         f"{'yes' if ratio <= limit else 'no'} |")
    if 0 in links:
        ratio = links[0]["facts --json (kept)"] / links[0]["ssh true"]
        lines.append(f"| facts --json (kept) at 0 ms <= 1.0x `ssh true` | {ratio:.2f}x | "
                     f"{'yes' if ratio <= 1.0 else 'no'} |")
    if many:
        ratio = many["all hosts (kept)"] / many["one host (kept)"]
        lines.append(f"| {int(many['hosts'])} hosts' facts (kept) <= 1.5x one host, at "
                     f"{many_rtt} ms | {many['all hosts (kept)']:.2f} s / "
                     f"{many['one host (kept)']:.2f} s = {ratio:.2f}x | "
                     f"{'yes' if ratio <= 1.5 else 'no'} |")
        ratio = many["jobs, all hosts (kept)"] / many["jobs, one host (kept)"]
        lines.append(f"| {int(many['hosts'])} hosts' jobs --json (kept) <= 1.5x one host, at "
                     f"{many_rtt} ms | {many['jobs, all hosts (kept)']:.2f} s / "
                     f"{many['jobs, one host (kept)']:.2f} s = {ratio:.2f}x | "
                     f"{'yes' if ratio <= 1.5 else 'no'} |")
    return "\n".join(lines)
