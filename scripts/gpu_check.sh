#!/usr/bin/env bash
# GPU session check: every GPU figure the open issues ask for, in one command.
#
#   bash scripts/gpu_check.sh          # = make gpu-check; results in $OUT (or out/)
#
# Steps, in priority order, each capped and all within GPU_CHECK_BUDGET_S (default 480 s,
# i.e. 8 minutes of a 10-minute call; steps that no longer fit are skipped and listed):
#   build      Cython extensions (installs .[gpu] first only where cupy is missing)
#   vendor     issue 30: python -m av_infer.bench.gpu_vendor: the five full-size DISB models
#              through vendor ops (cuDNN/cuBLASLt, vendor=auto) at fp32 and fp16 vs ONNX
#              Runtime (tolerance per precision, printed), ours vs torch eager and CUDA
#              graphs at the same precision, host cost per launched op  -> gpu_vendor.json
#   peer_torch issue 30: av-infer bench --peer torch, DISB A at fp32 then fp16, then C at
#              fp32 (GPU_CHECK_PEER_S s per system, rates x GPU_CHECK_PEER_RATE_SCALE,
#              default 1 = REEF's), all with av_infer under reef; then A fp32 with av_infer
#              under prio_streams (BE co-running at low stream priority, as torch's
#              systems do: is the BE gap, 0.43x on the H200's second lease, REEF's idle
#              BE during RT or our per-model speed?); then A fp32 under reef with
#              av_infer's RT model as one CUDA graph launch a request (--rt-graphs 2,
#              docs/cuda_graphs.md; never on a GPU before)        -> peer_torch.json
#   gil        issue 30/31: scripts/gpu_gil_check.py, is the RT client late because of the
#              GIL? (H200, 2026-11-27: RT client late p99 2-10 ms under av_infer, 0.1-0.2
#              ms under torch) the avi system of peer torch A fp32, switch interval 5000
#              (Python's) and 200 us alternating, 2 rounds each: RT p50/p99, lateness, BE
#              req/s, preemption; printed whole into gpu_check.log (no file in $OUT)
#   pad_select issue 30 item 3: scripts/gpu_pad_select_check.py, REEF Fig. 18a's no-BE
#              padded overhead of the five full-size DISB models, pad_select parts (old)
#              vs regs (new) vs plain, alternating, bit identity (docs/cuda.md); its padded
#              module is the bench step's (compiled once through the disk cache); printed
#              whole into gpu_check.log (no file of its own in $OUT)
#   pytest     pytest -m gpu on the cuda device, compile and vendor tests: the counts (and
#              the failing tests' ids) go into its row of gpu_check_steps.json
#   bench      python -m av_infer.bench.gpu_bench: dispatch us/kernel, conv/gemm and zoo
#              latency vs torch / ORT-CUDA, zoo vs ORT (1e-3), padded-no-BE overhead
#              (REEF Fig. 18a), the 5x5 DKP pair table (Fig. 16)       -> gpu_check.json
#   disb_A, disb_C   av-infer bench --device cuda --scale full, policies rt_only, reef,
#              wait, streams, prio_streams: RT latency vs rt_only, preemption latency
#              p50/p99, throughput                                     -> disb_cuda.json
#   sweep_A, sweep_C           the same workloads under reef for c = 1, 2, 4
#   sweep_A_wait, sweep_C_wait the same under wait (last: run only if time is left)
#   sim_profiles, sim_disb     issue 33, scripts/gpu_sim_steps.sh: measured kernel profiles
#              of the full-size zoo (~10-90 s) -> sim_profiles.json; DISB B, C, D, E,
#              trace, A (least measured first; SIM_WORKLOADS picks) under
#              rt_only/streams/reef/reef_dkp, 2 s each (~35-50 s per workload, plus
#              ~110-130 s once to compile the padded module cold; H200, 2026-11-27)
#              -> disb_sim.json; alone with GPU_CHECK_STEPS=build,sim_profiles,sim_disb
#              GPU_CHECK_BUDGET_S=540 (~7 min)
#   graphs     issue 30 item 2: scripts/gpu_graphs_check.py, full-size resnet152 on a BE
#              stream, plain vs gated CUDA graphs of 1 and of 4 ops per launch
#              (docs/cuda_graphs.md), with its vendor ops (plain: on the host flag
#              check; gated: captured into the gates' IF bodies, vendor_graphs=2;
#              telemetry says per op where a capture was refused): vs ORT, e2e
#              latency, host us/launch, flag-to-stop us, ran/skipped; first its RT mode:
#              resnet152 as RT requests plain vs one graph launch each (rt_graphs=2,
#              vendor auto; alone and beside a BE client; host us/request; bit-identical;
#              line "gpu_graphs_rt: {...}"); last, low priority; printed whole into
#              gpu_check.log (no file of its own in $OUT); alone with
#              GPU_CHECK_STEPS=build,graphs (not timed on a GPU yet; cap 270 s)
# Always: gpu_check.log (everything printed) and gpu_check_steps.json (status, rc and
# seconds per step). gpu_summary.json (issue 30 item 7's shape) is derived from
# gpu_vendor.json and peer_torch.json: printed into the log at the end, and made again where
# the results are committed (python -m av_infer.bench.gpu_summary DIR --gpu G --commit C).
# At most 8 files in $OUT, no folders: the device tool returns no more (2026-11-27, on an
# H200: log, steps, gpu_vendor, peer_torch, gpu_check, disb_cuda, sim_profiles, disb_sim).
# scripts/*.py import av_infer from the checkout: PYTHONPATH gets the checkout first (the
# GPU image's python3 has no av_infer installed; the graphs step failed on that, 2026-11-27).
# Order = priority (2026-11-27, third session): build, vendor, peer_torch, pytest, graphs
# (RT as one graph: new), sim_profiles, sim_disb, then the steps that already ran on a GPU
# (bench, disb_*, sweep_*: H100 2026-11-26; pad_select: H200 2026-11-27; gil: H200, both
# leases, no lever found). The steps above are described in
# their topic's order, not run order. A 15-minute lease fits about three calls started
# while the machine is warm (2026-11-27: 425 + 147 + 245 s of commands, 866 s held):
#   1. GPU_CHECK_STEPS=build,vendor,peer_torch,pytest GPU_CHECK_BUDGET_S=540 (timeout_s 590;
#      H200 2026-11-27 second lease: 447 s with gil and three peer runs; peer runs ~50 s
#      each, now five; gil (two leases, no lever found) left out of the recipe)
#   2. GPU_CHECK_STEPS=build,graphs,sim_profiles,sim_disb GPU_CHECK_BUDGET_S=... (what is
#      left; graphs first: RT as one graph, never measured on a GPU)
# (build is seconds when the tree's extensions are already built there).
#
# Knobs: GPU_CHECK_STEPS (comma list of the steps above; default all), GPU_CHECK_BUDGET_S,
# GPU_CHECK_DISB_S (seconds per DISB policy run, default 4), GPU_CHECK_SWEEP_S (default 3),
# GPU_CHECK_RATE_SCALE (DISB request rates x F, default 0.5: at REEF's rates, vgg19 RT at
# 100 Hz, our full-size vgg19 of 13.4 ms on an H100 overloads the GPU under every policy,
# rt_only too, 2026-11-26, docs/gpu_results.md; 1 reproduces REEF's rates),
# GPU_CHECK_PAIR_S (seconds per DKP pair and policy, default 0.5), GPU_CHECK_PEER_S
# (seconds per system of a --peer torch run, default 3), GPU_CHECK_PEER_RATE_SCALE
# (default 1), GPU_CHECK_COMMIT (the commit for gpu_summary.json where the checkout has no
# .git; default: git rev-parse HEAD), GPU_CHECK_NO_INSTALL=1
# (never pip install), PY (the interpreter: default .venv/bin/python if present, else
# python3, which on the GPU image has cupy, torch and onnxruntime and cannot fetch).
# The DISB steps read the workloads from shared/disb beside the checkout or inside it: a
# device machine that gets the checkout alone needs `mkdir -p shared && cp -r ../shared/disb
# shared/disb` first (shared/disb/workloads/A.json must exist: a bare `cp -r ../shared/disb
# shared/` into a checkout with no shared/ makes shared/workloads instead, and on 2026-11-27
# (H200, second lease) that cost a 185 s call whose DISB workloads all failed to load).
# Exit: 0 every step that ran passed; 1 a step failed or timed out; 2 no GPU; 3 DISB steps
# selected but no workloads.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PY PYTHONUNBUFFERED=1 GPU_CHECK_NO_INSTALL="${GPU_CHECK_NO_INSTALL:-}"
BUDGET_S=${GPU_CHECK_BUDGET_S:-480}
STEPS=${GPU_CHECK_STEPS:-build,vendor,peer_torch,gil,pytest,sim_profiles,sim_disb,bench,disb_A,disb_C,sweep_A,sweep_C,sweep_A_wait,sweep_C_wait,pad_select,graphs}
DISB_S=${GPU_CHECK_DISB_S:-4}
SWEEP_S=${GPU_CHECK_SWEEP_S:-3}
RATE_SCALE=${GPU_CHECK_RATE_SCALE:-0.5}
export RATE_SCALE
PAIR_S=${GPU_CHECK_PAIR_S:-0.5}
PEER_S=${GPU_CHECK_PEER_S:-3}
PEER_RATE_SCALE=${GPU_CHECK_PEER_RATE_SCALE:-1}
PARTS=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_parts.XXXXXX")
trap 'rm -rf "$PARTS"' EXIT
export PARTS
T0=$SECONDS
rc=0

# Steps that read the DISB workloads refuse to start without them, before any device time
# is spent on a build (exit 3).
case ",$STEPS," in
    *,sim_disb,*|*,disb_*|*,sweep_*)
        if ! "$PY" -c "from av_infer.bench.workload import workload_path; workload_path('A')" \
            2>/dev/null; then
            echo "gpu_check: no DISB workloads (shared/disb/workloads/A.json beside or inside" \
                "the checkout), and steps $STEPS read them: mkdir -p shared && cp -r" \
                "../shared/disb shared/disb before sending the tree, or leave those steps out" >&2
            exit 3
        fi ;;
esac
nvidia-smi || { echo "gpu_check: nvidia-smi failed: no GPU here" >&2; exit 2; }
echo "gpu_check: PY=$PY budget=${BUDGET_S}s steps=$STEPS rate_scale=$RATE_SCALE"

# disb_cuda.json from the DISB parts (policies.<W>, sweep_c.<policy>.<W>), and
# gpu_check_steps.json from the step log; rewritten after every step.
bundle() {
    "$PY" -c '
import json, sys
from pathlib import Path
parts, out = Path(sys.argv[1]), Path(sys.argv[2])
doc = {"policies": {}, "sweep_c": {}}
peers = []
for p in sorted(parts.glob("*.json")):
    kind, *rest = p.stem.split("_")
    try:
        d = json.loads(p.read_text())
    except ValueError:
        continue
    if kind == "disb":
        doc["policies"][rest[0]] = d
    elif kind == "sweep":
        doc["sweep_c"].setdefault(rest[1], {})[rest[0]] = d
    elif kind == "peer":
        peers.append(d)
if peers:
    (out / "peer_torch.json").write_text(json.dumps({"runs": peers}, indent=1))
if doc["policies"] or doc["sweep_c"]:
    (out / "disb_cuda.json").write_text(json.dumps(doc, indent=1))
log = parts / "steps.tsv"
steps = [{"step": a, "status": b, "rc": int(c), "seconds": int(d)}
         for a, b, c, d in (ln.split("\t") for ln in
                            (log.read_text().splitlines() if log.exists() else []))]
junit = parts / "gpu_pytest.xml"
if junit.exists():  # the pytest step: counts and failing ids instead of the xml file
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(junit).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        count = {k: sum(int(x.get(k, 0)) for x in suites)
                 for k in ("tests", "failures", "errors", "skipped")}
        bad = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")
               if c.find("failure") is not None or c.find("error") is not None]
        for row in steps:
            if row["step"] == "pytest":
                row.update(count, failed_ids=bad)
    except ET.ParseError:
        pass
(out / "gpu_check_steps.json").write_text(json.dumps(steps, indent=1))
' "$PARTS" "$OUTDIR"
}

# step NAME CAP_S CMD...: runs CMD if NAME is selected and time is left, under
# timeout min(CAP_S, budget left); records status, rc and seconds.
step() {
    local name=$1 cap=$2
    shift 2
    case ",$STEPS," in *",$name,"*) ;; *) return 0 ;; esac
    local left=$((BUDGET_S - (SECONDS - T0)))
    if [ "$left" -lt 20 ]; then
        echo "== gpu_check: SKIP $name (${left}s of the budget left); run it alone with" \
            "GPU_CHECK_STEPS=build,$name"
        printf '%s\tskipped\t0\t0\n' "$name" >>"$PARTS/steps.tsv"
        bundle
        return 0
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "== gpu_check: $name (cap ${cap}s, $((SECONDS - T0))s elapsed)"
    local t=$SECONDS
    timeout -k 15 "$cap" "$@"
    local r=$? status=ok
    [ "$r" -ne 0 ] && status=failed
    { [ "$r" -eq 124 ] || [ "$r" -eq 137 ]; } && status=timeout
    echo "== gpu_check: $name $status (rc $r) in $((SECONDS - t))s"
    printf '%s\t%s\t%d\t%d\n' "$name" "$status" "$r" "$((SECONDS - t))" >>"$PARTS/steps.tsv"
    [ "$r" -ne 0 ] && rc=1
    bundle
    return 0
}

build() {
    if [ -z "${GPU_CHECK_NO_INSTALL:-}" ] && ! "$PY" -c "import cupy" 2>/dev/null; then
        "$PY" -m pip install -q --disable-pip-version-check -e ".[gpu]" \
            || echo "gpu_check: pip install .[gpu] failed (no network?); using what is installed"
    fi
    "$PY" setup.py -q build_ext --inplace -j "$(nproc)" || return 1
    "$PY" -c "from av_infer.devices.cuda import availability as a; ok, why = a(); print('cuda:', ok, why); raise SystemExit(0 if ok else 2)"
}

# disb WORKLOAD PART [av-infer bench args]: one DISB run on the GPU into $PARTS/PART.json
disb() {
    local wl=$1 part=$2
    shift 2
    local cmd=("$PY" -m av_infer.cli bench --device cuda --scale full --workload "$wl"
               --rate-scale "$RATE_SCALE" --no-progress --json "$PARTS/$part.json" "$@")
    echo "${cmd[*]}"
    "${cmd[@]}"
}
# peer WORKLOAD PRECISION [POLICY [ARGS...]]: one av-infer bench --peer torch run into
# $PARTS/peer_<n>_....json (POLICY: av_infer's, default reef; ARGS: more bench arguments)
peer() {
    local wl=$1 prec=$2 pol=${3:-reef} n tag=""
    shift 3 2>/dev/null || shift $#
    n=$(ls "$PARTS"/peer_*.json 2>/dev/null | wc -l)
    [ $# -gt 0 ] && tag=_$(echo "$*" | tr -c 'a-zA-Z0-9\n' '_' | tr -s '_' | sed 's/^_//;s/_$//')
    local cmd=("$PY" -m av_infer.cli bench --peer torch --workload "$wl" --precision "$prec"
               --rate-scale "$PEER_RATE_SCALE" --duration "$PEER_S" --no-progress
               --policy "$pol" "$@" --json "$PARTS/peer_${n}_${wl}_${prec}_${pol}${tag}.json")
    echo "${cmd[*]}"
    "${cmd[@]}"
}
export -f build disb peer
export PEER_S PEER_RATE_SCALE

POLICIES=rt_only,reef,wait,streams,prio_streams
step build 180 bash -c build
if [ "$rc" -ne 0 ]; then
    echo "gpu_check: build or CUDA availability failed; nothing else can run"
    exit 1
fi
step vendor 150 "$PY" -m av_infer.bench.gpu_vendor --out "$OUTDIR"
step peer_torch 280 bash -c 'peer A fp32 && peer A fp16 && peer C fp32 && peer A fp32 prio_streams && peer A fp32 reef --rt-graphs 2'
step pytest 150 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests/devices/test_cuda_device.py \
    tests/kernels/test_cuda_compile.py tests/devices/test_cuda_vendor.py --junitxml="$PARTS/gpu_pytest.xml"
step graphs 270 "$PY" scripts/gpu_graphs_check.py --out "$PARTS/graphs" --repeats 10 --trials 20 \
    --graph-ops 1,4 --rt-graphs 2 --vendor auto --vendor-graphs 2
step sim_profiles 120 bash scripts/gpu_sim_steps.sh profiles "$OUTDIR"
step sim_disb 420 bash scripts/gpu_sim_steps.sh disb "$OUTDIR"
step bench 240 "$PY" -m av_infer.bench.gpu_bench --out "$OUTDIR" --pair-seconds "$PAIR_S"
for wl in A C; do
    cap=90
    [ "$wl" = C ] && cap=150
    step "disb_$wl" "$cap" bash -c 'disb "$0" "disb_$0" --policy "$1" --duration "$2"' \
        "$wl" "$POLICIES" "$DISB_S"
done
for pol in reef wait; do
    for wl in A C; do
        cap=60
        [ "$wl" = C ] && cap=100
        name=sweep_$wl
        [ "$pol" = wait ] && name=sweep_${wl}_wait
        step "$name" "$cap" bash -c 'disb "$0" "sweep_$0_$1" --sweep c=1,2,4 \
            --sweep-policy "$1" --duration "$2"' "$wl" "$pol" "$SWEEP_S"
    done
done
step pad_select 210 "$PY" scripts/gpu_pad_select_check.py --reps 10
step gil 130 "$PY" scripts/gpu_gil_check.py --workload A --precision fp32 --rounds 2 \
    --out "$PARTS/gil"
COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
for f in gpu_vendor.json peer_torch.json; do [ -f "$OUTDIR/$f" ] && cp "$OUTDIR/$f" "$PARTS/"; done
"$PY" -m av_infer.bench.gpu_summary "$PARTS" --commit "$COMMIT" \
    --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" \
    && { echo "gpu_summary.json (python -m av_infer.bench.gpu_summary):"; cat "$PARTS/gpu_summary.json"; } \
    || echo "gpu_check: gpu_summary.json could not be made"
echo "gpu_check: exit $rc after $((SECONDS - T0))s; in $OUTDIR: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
exit $rc
