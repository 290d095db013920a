#!/usr/bin/env bash
# The GPU checks of issues 40 and 45 in one run on one lent GPU (about 9 minutes), writing to $1:
#   bash benchmarks/gpu_run.sh OUT_DIR [SPEED_BUDGET_S] [STUDY_BUDGET_S]
# 1. benchmarks/gpu_check.py (speed, MFU, decoding; one traced step of the 1B full step, kept in
#    profile.tgz with its compiled HLO for benchmarks/gpu_trace.py);
# 2. configs/claims_study_gpu.py for what is left of the time (its per-stage metrics kept).
# Packages the GPU image lacks come as wheels in .whl/ (installed into a scratch folder when present):
# ml_collections, grain, array-record, portpicker, tensorboardX (pip download, the device README).
set -u
out=${1:?output folder}; speed_s=${2:-330}; study_s=${3:-200}
mkdir -p "$out"
work=$(mktemp -d)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl || exit 1
  export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1
export PYTHONUNBUFFERED=1
python3 benchmarks/gpu_check.py --out="$out/gpu_check.json" --budget_s="$speed_s" --profile_dir="$work/profile" \
  ${GPU_JOBS:+--jobs "$GPU_JOBS"} \
  2>&1 | tee "$out/gpu_check.log"
# the traced step and its compiled HLO, as benchmarks/gpu_trace.py reads them (here or back home:
# mkdir p && tar xzf profile.tgz -C p && python benchmarks/gpu_trace.py p, with xprof installed)
(cd "$work/profile" 2>/dev/null && tar -czf "$out/profile.tgz" $(find . -name '*.xplane.pb') \
  $(find ./hlo -name '*after_optimizations.txt' 2>/dev/null))
timeout -s INT "$study_s" python3 -m xlt.main --config=configs/claims_study_gpu.py --workdir="$work/claims_gpu" \
  > "$out/claims_gpu.log" 2>&1
echo "claims study exit: $?" >> "$out/claims_gpu.log"
tar -czf "$out/claims_gpu.tgz" -C "$work" --exclude='*.npz' --exclude='ckpt' --exclude='tb' claims_gpu 2>/dev/null
ls -la "$out"
