#!/usr/bin/env bash
# Run an xlt experiment on every worker of a Cloud TPU VM slice.
#   launch/tpu.sh my-tpu us-central2-b configs/graph.py gs://bucket/runs/graph [--config.x=y ...]
# The mesh axes come from the config (--config.mesh.data=-1 uses every chip for data
# parallelism; --config.mesh.fsdp / tensor shard parameters).
set -euo pipefail
tpu=${1:?tpu name}; zone=${2:?zone}; config=${3:?config}; workdir=${4:?workdir}; shift 4
repo=https://github.com/xlt-project/xlt.git  # or scp your checkout
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "
  set -e
  [ -d xlt ] || git clone $repo xlt
  cd xlt && pip install -q -U 'jax[tpu]' && pip install -q -e .
  python -m xlt.main --config=$config --workdir=$workdir $*
"
