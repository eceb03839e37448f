#!/usr/bin/env bash
# GPU session check: install the GPU extras, build, run the GPU tests, run the CUDA benches.
# Writes $OUT/gpu_check.json (or out/gpu_check.json); exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUTDIR=${OUT:-out}
mkdir -p "$OUTDIR"
nvidia-smi || { echo "gpu_check: nvidia-smi failed: no GPU here" >&2; exit 2; }
test -x "$PY" || python3 -m venv .venv
"$PY" -m pip install -q --disable-pip-version-check -e ".[gpu]"
"$PY" setup.py -q build_ext --inplace
"$PY" -c "from av_infer.devices.cuda import availability as a; ok, why = a(); print('cuda:', ok, why); raise SystemExit(0 if ok else 2)"
rc=0
"$PY" -m pytest -m gpu -q -rs tests/test_cuda_device.py tests/test_cuda_compile.py \
    --junitxml="$OUTDIR/gpu_pytest.xml" || rc=1
"$PY" -m av_infer.bench.gpu_bench --out "$OUTDIR" || rc=1
echo "gpu_check: pytest+bench exit $rc; JSON in $OUTDIR/gpu_check.json"
exit $rc
