#!/usr/bin/env bash
# Runs an xlt experiment on a Cloud TPU VM slice: create the slice, ship this checkout to
# every worker, install, run on all workers, copy the results back, delete the slice.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/tpu.sh --name NAME --zone ZONE --config CONFIG --workdir DIR [options] [-- --config.x=y ...]

Creates a Cloud TPU VM slice, copies THIS checkout (tracked and untracked, not ignored,
files) to every worker, installs it as the README does (jax[tpu], then pip install -e .),
unpacks it in ~/xlt on each worker (replacing what is there),
runs `python3 -m xlt.main` on all workers at once, copies the workdir back from worker 0
and deletes the slice (also when a step fails, unless --keep).

required:
  --name NAME          TPU VM name
  --zone ZONE          e.g. us-central2-b
  --config CONFIG      config file relative to the checkout, e.g. configs/graph.py or configs/addition.py:cpu
  --workdir DIR        workdir on the workers, relative to the checkout (~/xlt) or absolute. A
                       multi-host slice (v4-16 and up) needs an absolute path on a filesystem all
                       workers share (e.g. one bucket mounted with gcsfuse at the same path on
                       each): each worker sees only its own disk, and xlt writes workdirs with
                       plain file I/O, so gs:// URLs do not work.
options:
  --accelerator TYPE   accelerator type (default v4-8)
  --version VERSION    TPU software version (default tpu-ubuntu2204-base)
  --project PROJECT    gcloud project (default: gcloud's configured one)
  --results DIR        local directory for the copied-back workdir (default runs/tpu_NAME)
  --existing           use an existing slice: neither create nor delete it
  --keep               do not delete the slice at the end
  --dry-run            print every command, run none (needs no gcloud)
  -h, --help           this text
Arguments after `--` go to xlt.main unchanged.

needs: gcloud (authenticated, TPU API enabled) and git; the workers install from PyPI.
jax.distributed.initialize() finds the other workers of a TPU VM slice by itself, so no
coordinator flags are needed.

mesh flags (one device per TPU chip, all hosts together):
  --config.mesh.data=-1                        every chip data parallel (the default)
  --config.mesh.fsdp=-1 --config.mesh.data=1   shard parameters over every chip (large models)
  --config.mesh.data=-1 --config.mesh.tensor=4 tensor parallel inside groups of 4 chips
EOF
}

die() { echo "tpu.sh: $*" >&2; echo "run launch/tpu.sh --help for usage" >&2; exit 2; }

name="" zone="" config="" workdir="" accelerator="v4-8" version="tpu-ubuntu2204-base"
project="" results="" existing=0 keep=0 dry_run=0
extra=()
while (($#)); do
  case "$1" in
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --zone) zone=${2:?--zone needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --accelerator) accelerator=${2:?--accelerator needs a value}; shift 2 ;;
    --version) version=${2:?--version needs a value}; shift 2 ;;
    --project) project=${2:?--project needs a value}; shift 2 ;;
    --results) results=${2:?--results needs a value}; shift 2 ;;
    --existing) existing=1; shift ;;
    --keep) keep=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done
for required in name zone config workdir; do
  [[ -n "${!required}" ]] || die "missing required --$required"
done
results=${results:-runs/tpu_$name}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gcloud_tpu=(gcloud compute tpus tpu-vm)
where=(--zone="$zone")
[[ -n "$project" ]] && where+=(--project="$project")

# shellcheck source=launch/common.sh
source "$repo/launch/common.sh"  # show, run

# The remote commands are strings for ssh; each piece is quoted for the worker's shell.
quote() { printf '%q ' "$@"; }
main_args=$(quote --config="$config" --workdir="$workdir" "${extra[@]}")
main_args=${main_args% }

created=0
cleanup() {
  if ((created && !keep)); then
    run "${gcloud_tpu[@]}" delete "$name" "${where[@]}" --quiet
  fi
}
trap cleanup EXIT

if ((!existing)); then
  run "${gcloud_tpu[@]}" create "$name" "${where[@]}" --accelerator-type="$accelerator" --version="$version"
  created=1
fi

# Ship the working tree as it is (uncommitted edits included), never a remote clone.
tarball=$(mktemp -u "${TMPDIR:-/tmp}/xlt_checkout.XXXXXX").tar.gz
pack_checkout "$repo" "$tarball"
run "${gcloud_tpu[@]}" scp "$tarball" "$name":xlt.tar.gz "${where[@]}" --worker=all
((dry_run)) || rm -f "$tarball"

run "${gcloud_tpu[@]}" ssh "$name" "${where[@]}" --worker=all \
  --command="rm -rf ~/xlt && mkdir -p ~/xlt && tar -xzf ~/xlt.tar.gz -C ~/xlt && cd ~/xlt \
&& python3 -m pip install -q -U \"jax[tpu]\" && python3 -m pip install -q -e ."

run "${gcloud_tpu[@]}" ssh "$name" "${where[@]}" --worker=all \
  --command="cd ~/xlt && python3 -m xlt.main $main_args"

if [[ "$workdir" == /* ]]; then remote_workdir=$workdir; else remote_workdir="xlt/$workdir"; fi  # scp: relative to the home
run mkdir -p "$results"
run "${gcloud_tpu[@]}" scp --recurse "$name:$remote_workdir" "$results" "${where[@]}" --worker=0
echo "tpu.sh: results in $results"
