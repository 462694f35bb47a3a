#!/usr/bin/env bash
# bench/device_check.sh [OUTDIR]: our remote side, run on THIS machine with no SSH.
#
# 1. facts:    renders the facts script (provision.gather.facts_script with the shipped
#              platforms), runs it with bash, parses it (parse_facts(...).as_json()).
# 2. nccl:     NCCL's start-up on every GPU the facts list: the payload's nccl_check.py
#              --allreduce N (one process per GPU, init_process_group, an all-reduce), with
#              NCCL_DEBUG=WARN; skipped without GPUs.
# 3. validate: renders templates/setup/validate.sh.j2 with the config the validate step computes
#              (validation_config for these facts and the default recipe) and runs it with bash.
# 3b. sustained: the same with validate --sustained's config (SUSTAINED_S seconds, default 45,
#              of every GPU loaded at once): its checks, per-GPU rates second by second and the
#              clocks, power, temperature and clock-event reasons sampled during the load go into
#              summary.json ("sustained"), one line per GPU on stdout.
# 4. bench:    renders templates/gpu/bench.sh.j2 like the bench step (no mirrors: nothing is
#              downloaded) and runs it with bash.
#
# All run "$PYTHON" (default python3, which must have torch) the way the steps run the env's
# python. Every part has a time limit; a part that fails is recorded (exit code, stderr tail)
# and the next runs. Files, flat in OUTDIR (default $OUT): facts-stdout.json, facts.json,
# validate-stdout.txt, validate.json, bench-stdout.txt, bench.json, summary.json (NCCL's
# start-up result and its warnings in "parts"."nccl"), and fit-measure.json from the block at the
# end. One summary line per part on stdout; exit 0 when every part ran and its JSON parsed.
#
# Needs bash, coreutils' timeout and a python with jinja2, pyyaml and packaging (Fabric and
# paramiko are not needed: nothing here connects anywhere). Each step script writes what it
# reports to $RESULT, as under the step runtime: here validate.result and bench.result.
#
# Limits (seconds): FACTS_TIMEOUT (40), NCCL_TIMEOUT (45), VALIDATE_TIMEOUT (100),
# SUSTAINED_TIMEOUT (120), BENCH_TIMEOUT (90), FIT_TIMEOUT (60), the three render parts 15 each:
# 500 s, and with each of the 9 parts' 5 s kill grace 545 s at the very worst, inside one 600 s
# device call (the summary is written before the fit block, so it survives even that).
set -u

out=${1:-${OUT:-}}
if [ -z "$out" ]; then
  echo "usage: $0 OUTDIR   (or set OUT)" >&2
  exit 2
fi
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/home/.gpu-provision" "$work/data"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
all_ok=1

# run PART LIMIT COMMAND...: stdout -> $work/PART.out, stderr -> $work/PART.err, rc and time.
run() {
  local part=$1 limit=$2 start
  shift 2
  start=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$work/$part.out" 2>"$work/$part.err"
  echo $? >"$work/$part.rc"
  awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }' >"$work/$part.seconds"
}

# -- 1. facts ---------------------------------------------------------------------------------
run facts-render 15 "$py" -c 'import sys

from provision.facts.gather import facts_script
from provision.config.recipes import all_platforms
sys.stdout.write(facts_script(all_platforms(), (sys.argv[1],)))' "$work/data"
cp "$work/facts-render.out" "$work/facts.sh"
run facts "${FACTS_TIMEOUT:-40}" bash "$work/facts.sh"
cp "$work/facts.out" "$out/facts-stdout.json"
run facts-parse 15 "$py" -c 'import sys

import json
from provision.facts.host import parse_facts
from provision.facts.gather import markers_of
from provision.config.recipes import all_platforms
doc = json.load(open(sys.argv[1]))
facts = parse_facts(doc, markers_of(all_platforms()))
json.dump(facts.as_json(), open(sys.argv[2], "w"), indent=1, default=str)' \
  "$work/facts.out" "$out/facts.json"

# -- 2, 3 and 4. the step scripts, rendered as the steps render them ------------------------
run render-steps 15 "$py" -c 'import sys

import json
from pathlib import Path
from provision.facts.host import parse_facts
from provision.facts.gather import markers_of
from provision.config.inventory import Target, settings_for
from provision.ops.validate import BENCH_PAYLOAD, bench_body, payload, validate_body, validation_config
from provision.config.recipes import all_platforms
work, py = sys.argv[1], sys.argv[2]
try:
    facts = parse_facts(json.load(open(work + "/facts.out")), markers_of(all_platforms()))
except Exception as exc:  # no facts: validate in CPU mode all the same, and say so
    print(f"no facts ({exc!r}): validating without a GPU count", file=sys.stderr)
    config = {"expected_gpus": 0, "advertised": None, "thresholds": {}, "reference": {},
              "data_dir": work + "/data"}
else:
    settings = settings_for(Target(name="device-check", host="localhost"), facts.platform,
                            {"data_dir": work + "/data"})
    config = validation_config(facts, settings)
Path(work + "/gpus").write_text(str(config["expected_gpus"]))
Path(work + "/payload").mkdir(exist_ok=True)
for name, text in payload(BENCH_PAYLOAD):  # for the NCCL start-up check, as the steps write it
    Path(work + "/payload/" + name).write_text(text)
Path(work + "/validate.sh").write_text(validate_body(py, config, {}, "device-check"))
# validate --sustained: the same config with the seconds of every GPU loaded at once
held = {**config, "thresholds": {**config["thresholds"], "sustained_s": float(sys.argv[3])}}
Path(work + "/sustained.sh").write_text(validate_body(py, held, {}, "device-check-sustained"))
bench = {"data_dir": work + "/data", "mirrors": [], "download_mb": 1, "download_timeout": 5}
Path(work + "/bench.sh").write_text(bench_body(py, bench))' "$work" "$(command -v "$py" || echo "$py")" \
  "${SUSTAINED_S:-45}"

# NCCL's start-up: one process per GPU through init_process_group and an all-reduce, in the
# words NCCL_DEBUG=WARN gives (the multi-GPU tier's first rung, alone)
gpus=$(cat "$work/gpus" 2>/dev/null || echo 0)
if [ "${gpus:-0}" -ge 1 ] 2>/dev/null; then
  run nccl "${NCCL_TIMEOUT:-45}" env NCCL_DEBUG="${NCCL_DEBUG:-WARN}" \
    "$py" "$work/payload/nccl_check.py" --allreduce "$gpus" nccl 16 5
else
  echo '{"skipped": "no GPU in the facts"}' >"$work/nccl.out"; : >"$work/nccl.err"
  echo 0 >"$work/nccl.rc"; echo 0.0 >"$work/nccl.seconds"
fi

run validate "${VALIDATE_TIMEOUT:-100}" env HOME="$work/home" RESULT="$work/validate.result" \
  bash "$work/validate.sh"
cp "$work/validate.out" "$out/validate-stdout.txt"
run sustained "${SUSTAINED_TIMEOUT:-120}" env HOME="$work/home" RESULT="$work/sustained.result" \
  bash "$work/sustained.sh"
run bench "${BENCH_TIMEOUT:-90}" env HOME="$work/home" RESULT="$work/bench.result" \
  bash "$work/bench.sh"
cp "$work/bench.out" "$out/bench-stdout.txt"

# -- the parsed results and the summary -----------------------------------------------------
# (stdlib only: when "$py" cannot run at all, python3 writes the summary)
sumpy=$py
"$sumpy" -c '' 2>/dev/null || sumpy=python3
"$sumpy" - "$work" "$out" <<'PY' || all_ok=0
import json, platform, sys, time
work, out = sys.argv[1], sys.argv[2]

def part(name):
    def read(ext, default=""):
        try:
            return open(f"{work}/{name}.{ext}", errors="replace").read()
        except OSError:
            return default
    rc = read("rc").strip()
    return {"rc": int(rc) if rc.lstrip("-").isdigit() else None,
            "seconds": float(read("seconds") or 0), "stderr_tail": read("err")[-4000:]}

def result_of(name):
    try:
        return json.load(open(f"{work}/{name}.result"))
    except (OSError, ValueError):
        return None

parts = {n: part(n) for n in ("facts-render", "facts", "facts-parse", "render-steps", "nccl",
                              "validate", "sustained", "bench")}
lines = []
try:
    facts = json.load(open(f"{out}/facts.json"))
    gpus = ", ".join(g["name"] for g in facts["gpus"]) or "no GPU"
    what = f"{len(facts['gpus'])} GPU(s): {gpus}; driver {facts['driver']}, CUDA " \
           f"{facts['driver_cuda']}; {facts['nvidia_detail']}"
    ok = all(parts[p]["rc"] == 0 for p in ("facts-render", "facts", "facts-parse"))
except (OSError, ValueError, KeyError, TypeError) as exc:
    what, ok = f"no parsed facts ({exc.__class__.__name__})", False
parts["facts"]["ok"] = ok
lines.append(f"facts: {'done' if ok else 'FAILED'} (rc {parts['facts']['rc']}, "
             f"{parts['facts']['seconds']}s): {what}")

n = parts["nccl"]
try:
    said = json.loads((open(f"{work}/nccl.out").read().strip().splitlines() or ["{}"])[-1])
except (OSError, ValueError):
    said = None
warn = [ln for ln in n["stderr_tail"].splitlines() if "NCCL WARN" in ln]
n["ok"] = n["rc"] == 0 and isinstance(said, dict) and (said.get("ok") or "skipped" in said)
if isinstance(said, dict) and "skipped" in said:
    what = f"skipped: {said['skipped']}"
elif n["ok"]:
    what = f"all-reduce correct, bus bandwidth {said.get('busbw_gbs')} GB/s"
elif n["rc"] == 124:
    what = "no answer in time (init or the all-reduce hung)"
else:
    what = (n["stderr_tail"].strip().splitlines() or ["no result"])[-1][:200]
if warn:
    what += f"; NCCL said: {warn[0].strip()[:200]}"
n.update(result=said, nccl_warn=warn[:5])  # in summary.json: the device tool brings back 8 files
lines.append(f"nccl: {'done' if n['ok'] else 'FAILED'} (rc {n['rc']}, {n['seconds']}s): {what}")

for name, path in (("validate", "validate.json"), ("bench", "bench.json")):
    p = parts[name]
    result = result_of(name)
    p["ok"] = p["rc"] == 0 and result is not None
    if result is not None:
        json.dump(result, open(f"{out}/{path}", "w"), indent=1)
    if result is None:
        why = (p["stderr_tail"].strip().splitlines() or ["no result written"])[-1][:200]
        if parts["render-steps"]["rc"] != 0:
            why = "the step scripts were not rendered: " + \
                  (parts["render-steps"]["stderr_tail"].strip().splitlines() or ["?"])[-1][:160]
        what = why
    elif name == "validate":
        bad = [c for c in result.get("checks", []) if c.get("status") != "pass"]
        what = f"verdict {result.get('verdict')} ({result.get('mode')}, torch {result.get('torch')})" \
               + (f"; {bad[0]['name']}: {bad[0]['reason']}" if bad else "")
    else:
        tf = ", ".join(f"{k} {v}" for k, v in (result.get("tflops") or {}).items())
        what = f"{result.get('mode')}, torch {result.get('torch')}; TFLOPS {tf or '-'}; " \
               f"train {result.get('train_samples_s')} samples/s" \
               + (f"; {result['notes'][0]}" if result.get("notes") else "")
    lines.append(f"{name}: {'done' if p['ok'] else 'FAILED'} (rc {p['rc']}, {p['seconds']}s): "
                 f"{what[:300]}")

# the sustained tier: its checks, and per GPU the rate each second and nvidia-smi's samples
held = result_of("sustained")
p = parts["sustained"]
p["ok"] = p["rc"] == 0 and held is not None
sustained, said = None, []
if held is not None:
    m = (held.get("measurements") or {}).get("sustained") or {}
    sustained = {"verdict": held.get("verdict"), "checks": [c for c in held.get("checks", [])
                 if "sustain" in c.get("name", "") or c.get("name") == "gpu caps"], "measured": m}
    bad = [c for c in held.get("checks", []) if c.get("status") != "pass"]
    what = (f"{m.get('dtype')} on {len(m.get('gpus') or [])} GPU(s) for {m.get('seconds')} s of load "
            f"({m.get('wall_s')} s)" if m else "no GPU was loaded" +
            (f"; {bad[0]['name']}: {bad[0]['reason']}" if bad else ""))
    said.append(f"sustained: {'done' if p['ok'] else 'FAILED'} (rc {p['rc']}, {p['seconds']}s): verdict "
                f"{held.get('verdict')}; {what[:300]}")
    said += [f"  {c['name']}: {c['status']}: {c['reason'][:400]}" for c in sustained["checks"]]
else:
    said.append(f"sustained: FAILED (rc {p['rc']}, {p['seconds']}s): " +
                (p["stderr_tail"].strip().splitlines() or ["no result written"])[-1][:200])
at = next((k + 1 for k, line in enumerate(lines) if line.startswith("validate:")), len(lines))
lines[at:at] = said  # in the order the parts ran
summary = {"host": platform.node(), "python": sys.executable, "at": time.strftime(
    "%Y-%m-%dT%H:%M:%S%z"), "parts": parts, "lines": lines, "sustained": sustained,
    "ok": all(parts[n].get("ok") for n in ("facts", "nccl", "validate", "sustained", "bench"))}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
print("\n".join(lines))
sys.exit(0 if summary["ok"] else 1)
PY

# == fit --measure's startup hook on a real GPU ================================================
# (its own block: it changes no part above and not the exit code.) templates/fit/measure_run.py
# runs a small torch job at batch 1, 2 and 4 with templates/fit/measure_hook.py as every
# process's sitecustomize (torch.cuda.max_memory_allocated/reserved at exit) while nvidia-smi's
# memory.used is sampled, then once at batch 16; the line fitted to the first three
# (provision/fit/measure.py) predicts the fourth. The job holds 2 x 256 MiB per sample at its
# peak (x and x * 2), so the slope should come out near 0.5 GiB per sample. File:
# fit-measure.json; one more summary line. FIT_TIMEOUT (60).
fitdir="$work/fit"
mkdir -p "$fitdir/hook"
cp "$repo/templates/fit/measure_hook.py" "$fitdir/hook/sitecustomize.py"
cat > "$fitdir/job.py" <<'PY'
import os

import torch

b = int(os.environ["BATCH"])
x = torch.randn(b, 64, 1024, 1024, device="cuda")  # 256 MiB of fp32 per sample
y = (x * 2).sum()
torch.cuda.synchronize()
print("batch", b, "sum", float(y))
PY
cat > "$fitdir/drive.py" <<'PY'
import json, subprocess, sys
repo, d, out, py = sys.argv[1:5]
from provision.fit.measure import predict, read_runs

def measure(batches, limit):
    cfg = {"argv": [py, f"{d}/job.py"], "batches": batches, "env_var": "BATCH", "seconds": 15,
           "hook_dir": f"{d}/hook", "path": None, "workdir": d}
    r = subprocess.run([py, f"{repo}/templates/fit/measure_run.py", json.dumps(cfg)],
                       capture_output=True, text=True, timeout=limit)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-2000:]}

small = measure([1, 2, 4], 55)
result = {"small": small}
gpu, runs = read_runs(small) if "error" not in small else (False, [])
if not gpu:
    line = "skipped: " + (small.get("error", "").strip().splitlines() or
                          ["nvidia-smi sees no GPU here (fit --measure needs one)"])[-1][:200]
else:
    big = measure([16], 25)
    result["big"] = big
    result["predicted"] = [p.as_json() for p in predict(runs, 16)]
    _, [at16] = read_runs(big)
    result["actual_16"] = {"torch_gb": at16.torch_allocated_gb, "smi_gb": at16.smi_peak_gb,
                           "rc": at16.rc}
    got = {"torch": at16.torch_allocated_gb, "nvidia-smi": at16.smi_peak_gb}
    line = "; ".join(f"{p['source']}: {p['a_gb']} + {p['b_gb_per_sample']} x batch -> "
                     f"{p['predicted_gb']} GB at 16, measured {got[p['source']]}"
                     for p in result["predicted"])
json.dump(result, open(f"{out}/fit-measure.json", "w"), indent=1)
print(line)
PY
run fit-measure "${FIT_TIMEOUT:-60}" env HOME="$fitdir" "$py" "$fitdir/drive.py" "$repo" \
  "$fitdir" "$out" "$(command -v "$py" || echo "$py")"
fitrc=$(cat "$work/fit-measure.rc")
fitsaid=$(tail -n 1 "$work/fit-measure.out" 2>/dev/null)
fitstate=done
case "$fitsaid" in skipped:*) fitstate=skipped; fitsaid=${fitsaid#skipped: } ;; esac
if [ "$fitrc" != 0 ]; then fitstate=FAILED; fitsaid=$(tail -n 1 "$work/fit-measure.err" 2>/dev/null); fi
echo "fit-measure: $fitstate (rc $fitrc, $(cat "$work/fit-measure.seconds")s): $fitsaid"
# == end of fit --measure's block ===============================================================

[ $all_ok = 1 ] && exit 0 || exit 1
