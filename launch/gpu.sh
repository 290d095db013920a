#!/usr/bin/env bash
# Runs an xlt experiment on one GPU host (all its GPUs), here or over ssh: a venv,
# jax[cuda12], this checkout installed editable, then xlt.main.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/gpu.sh --config CONFIG --workdir DIR [options] [-- --config.x=y ...]

On this machine: creates a venv (if missing), installs jax[cuda12] and this checkout
(pip install -e .), and runs `python -m xlt.main` from the checkout.
With --host: copies THIS checkout (tracked and untracked, not ignored, files) to ~/xlt on
the host (replacing what is there), does the same there over ssh, and copies the workdir
back.

required:
  --config CONFIG   config file relative to the checkout, e.g. configs/addition.py
  --workdir DIR     workdir, relative to the checkout (or absolute)
options:
  --host [USER@]HOST  run there over ssh (default: here)
  --venv DIR          virtual environment (default $HOME/xlt-venv, expanded where it runs)
  --results DIR       with --host: local directory for the copied-back workdir (default runs/gpu_HOST)
  --dry-run           print every command, run none
  -h, --help          this text
Arguments after `--` go to xlt.main unchanged.

needs: python3 with venv, NVIDIA driver for CUDA 12 (pip brings the CUDA libraries);
with --host also ssh and scp to that host. XLA_PYTHON_CLIENT_PREALLOCATE=false is set, so
small models take GPU memory as they need it.

mesh flags (one device per GPU):
  --config.mesh.data=-1                        every GPU data parallel (the default)
  --config.mesh.fsdp=-1 --config.mesh.data=1   shard parameters over every GPU
  --config.mesh.devices=1                      use only the first GPU
EOF
}

die() { echo "gpu.sh: $*" >&2; echo "run launch/gpu.sh --help for usage" >&2; exit 2; }

# shellcheck disable=SC2016  # $HOME is expanded by the shell that runs the steps (maybe remote)
config="" workdir="" host="" venv='$HOME/xlt-venv' results="" dry_run=0
extra=()
while (($#)); do
  case "$1" in
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --host) host=${2:?--host needs a value}; shift 2 ;;
    --venv) venv=${2:?--venv needs a value}; shift 2 ;;
    --results) results=${2:?--results needs a value}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done
for required in config workdir; do
  [[ -n "${!required}" ]] || die "missing required --$required"
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/common.sh
source "$repo/launch/common.sh"  # show, run, pack_checkout

# The same steps here and there, as one line for `bash -c` or ssh; the venv path is left
# unquoted for that shell to expand ($HOME is the remote home with --host).
q() { local s; s=$(printf '%q ' "$@"); echo "${s% }"; }
steps="{ [ -d $venv ] || python3 -m venv $venv; } && . $venv/bin/activate \
&& pip install -q -U \"jax[cuda12]\" && pip install -q -e . \
&& XLA_PYTHON_CLIENT_PREALLOCATE=false python -m xlt.main $(q --config="$config" --workdir="$workdir" "${extra[@]}")"

if [[ -z "$host" ]]; then
  cd "$repo"
  run bash -c "$steps"
  exit 0
fi

results=${results:-runs/gpu_${host#*@}}
tarball=$(mktemp -u "${TMPDIR:-/tmp}/xlt_checkout.XXXXXX").tar.gz
pack_checkout "$repo" "$tarball"
run scp "$tarball" "$host":xlt.tar.gz
((dry_run)) || rm -f "$tarball"
run ssh "$host" "rm -rf ~/xlt && mkdir -p ~/xlt && tar -xzf ~/xlt.tar.gz -C ~/xlt"
run ssh "$host" "cd ~/xlt && $steps"
run mkdir -p "$results"
if [[ "$workdir" == /* ]]; then remote_workdir=$workdir; else remote_workdir="xlt/$workdir"; fi
run scp -r "$host:$remote_workdir" "$results"
echo "gpu.sh: results in $results"
