#!/usr/bin/env bash
# Run an xlt experiment on a cloud GPU VM (one or more GPUs on one host).
#   launch/gpu.sh configs/graph.py gs://bucket/runs/graph [--config.field=value ...]
# Assumes the VM has CUDA 12+ drivers; installs xlt with jax[cuda12] into a venv.
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
python3 -m venv ~/xlt-venv && source ~/xlt-venv/bin/activate
pip install -q -U "jax[cuda12]" && pip install -q -e .
# Small models: let XLA take memory as it needs it, so several runs can share a GPU.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m xlt.main --config="$config" --workdir="$workdir" "$@"
