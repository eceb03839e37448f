#!/usr/bin/env bash
# GPU steps of issue 33 (the simulator against the GPU), called by scripts/gpu_check.sh:
#
#   bash scripts/gpu_sim_steps.sh profiles OUTDIR   # -> OUTDIR/sim_profiles.json
#   bash scripts/gpu_sim_steps.sh disb OUTDIR       # -> OUTDIR/disb_sim.json
#
# profiles  every full-size zoo model (vgg19, resnet152, densenet201, inception_v3,
#           distilbert) compiled and loaded on the cuda device, each kernel timed alone
#           (CUDA events, median of 3) with its blocks per SM (occupancy API), the GPU's
#           name and clocks: one bundle of measured profiles (python -m
#           av_infer.bench.gpu_profiles; rewritten after each model). Expected ~60-90 s on
#           an H100 when the kernels are not in the compile cache yet, ~20 s when they are.
# disb      DISB D, E, the repository's trace (av_infer/bench/workloads/trace_cams.json),
#           B, C, A on the cuda device under rt_only, streams, reef, reef_dkp, at
#           RATE_SCALE (gpu_check's, default 0.5) for SIM_DISB_S seconds per policy
#           (default 2), standalone-n 5: one bundle in disb_cuda.json's format, rewritten
#           after each workload, so a timeout keeps what finished; each workload's line
#           ends with the seconds it took. Order: the workloads no GPU has run first (A and
#           C ran on an H200 on 2026-11-27, docs/gpu_results/2026-11-27-h200/), the five-
#           model ones together (they share one padded module, below).
#           Where the time goes (that H200 run's log and wall_s): every policy run loads
#           every model afresh (runs are independent): ~6.5 s per policy for A's two
#           full-size models, ~9.5 s for C's five, the 2 s window included; the standalone
#           reference is one load more. So ~35 s per two-model workload (A, B) and ~50 s
#           per five-model one (C, D, E, trace). reef_dkp compiles the padded dispatcher
#           module over the workload's models before its window (bench harness,
#           Bench._prepare_padding): 110 s for the five models on the H200 when
#           ~/.cache/av_infer/cuda is cold, a cache hit afterwards for every workload of
#           the same models (gpu_check's pad_select step compiles the five in the same
#           order, which should make it one too: not yet seen on a GPU); the
#           two-model module is small (A's reef_dkp run took 6.8 s, reef's 6.2 s). That
#           run's C reef_dkp took 110 s with padding in 2.5 % of its BE launches: the
#           modules compiled during the window and the runtime's close waited for them
#           (before the harness prepared them). Expected: ~4.5 min for all six with the
#           cache warm, ~6.5 min cold.
#
# Afterwards, on any machine (no GPU):
#   av-infer bench --compare-sim OUTDIR/disb_sim.json --profiles OUTDIR/sim_profiles.json \
#       --json sim_fidelity.json
#   av-infer bench --refit-contention OUTDIR/disb_sim.json \
#       --profiles OUTDIR/sim_profiles.json --params-out contention_<gpu>.json
# (docs/sim_fidelity.md). PY: the interpreter (gpu_check exports it). For a dry run of the
# script's plumbing without a GPU: SIM_DEVICE=cuda-emu SIM_MODELS=tiny_cnn SIM_VARIANT=scaled
# (profiles) and SIM_DEVICE=sim SIM_WORKLOADS=A SIM_DISB_S=0.2 (disb).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: gpu_sim_steps.sh profiles|disb OUTDIR}
OUTDIR=${2:-${OUT:-out}}
mkdir -p "$OUTDIR"
PY=${PY:-python3}
RATE_SCALE=${RATE_SCALE:-${GPU_CHECK_RATE_SCALE:-0.5}}
SIM_DISB_S=${SIM_DISB_S:-2}
SIM_POLICIES=${SIM_POLICIES:-rt_only,streams,reef,reef_dkp}
# order = what a GPU has measured least (2026-11-27: B never; C on the first H200 lease
# only; D, E, trace_cams and A on the second)
SIM_WORKLOADS=${SIM_WORKLOADS:-B,C,D,E,av_infer/bench/workloads/trace_cams.json,A}
SIM_DEVICE=${SIM_DEVICE:-cuda}
SIM_MODELS=${SIM_MODELS:-vgg19,resnet152,densenet201,inception_v3,distilbert}
SIM_VARIANT=${SIM_VARIANT:-full}

case "$what" in
profiles)
    exec "$PY" -m av_infer.bench.gpu_profiles --device "$SIM_DEVICE" --variant "$SIM_VARIANT" \
        --models "$SIM_MODELS" --repeats 3 --bundle "$OUTDIR/sim_profiles.json"
    ;;
disb)
    parts=$(mktemp -d "${TMPDIR:-/tmp}/gpu_sim_parts.XXXXXX")
    rc=0
    IFS=, read -r -a wls <<<"$SIM_WORKLOADS"
    for wl in "${wls[@]}"; do
        tag=$(basename "$wl" .json)
        echo "== gpu_sim_steps: disb $tag ($SIM_POLICIES, ${SIM_DISB_S}s each, rates x$RATE_SCALE)"
        t0=$SECONDS
        wrc=0
        "$PY" -m av_infer.cli bench --device "$SIM_DEVICE" --scale full --workload "$wl" \
            --policy "$SIM_POLICIES" --duration "$SIM_DISB_S" --rate-scale "$RATE_SCALE" \
            --standalone-n 5 --no-progress --json "$parts/$tag.json" || { wrc=$?; rc=1; }
        echo "== gpu_sim_steps: disb $tag rc $wrc in $((SECONDS - t0)) s"
        "$PY" -c '
import json, sys
from pathlib import Path
parts, out = Path(sys.argv[1]), Path(sys.argv[2])
doc = {"policies": {}}
for p in sorted(parts.glob("*.json")):
    try:
        doc["policies"][p.stem] = json.loads(p.read_text())
    except ValueError:
        pass
out.write_text(json.dumps(doc, indent=1))
' "$parts" "$OUTDIR/disb_sim.json"
    done
    rm -rf "$parts"
    exit $rc
    ;;
*)
    echo "gpu_sim_steps.sh: unknown step $what (profiles|disb)" >&2
    exit 2
    ;;
esac
