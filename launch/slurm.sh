#!/usr/bin/env bash
# Runs an xlt experiment on several GPU nodes under SLURM: installs this checkout into a
# venv, writes an sbatch script whose srun starts one process per node (or per GPU), each
# told the coordinator (the allocation's first node), the process count and its rank.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launch/slurm.sh --nodes N --config CONFIG --workdir DIR [options] [-- --config.x=y ...]

Run from a login node, in a checkout on a filesystem the compute nodes share (they run
this checkout in place, and every process writes the same workdir). Installs the checkout
into a venv (pip install -U "jax[cuda12]", pip install -e .) unless --no-install, writes
runs/slurm/JOB.sbatch and submits it with sbatch. In the job, srun starts the processes and
each runs
  python -m xlt.main --config=CONFIG --workdir=DIR \
    --coordinator_address=FIRST_NODE:PORT --num_processes=$SLURM_NTASKS --process_id=$SLURM_PROCID
with FIRST_NODE = the first of `scontrol show hostnames "$SLURM_JOB_NODELIST"`.

required:
  --nodes N            number of nodes
  --config CONFIG      config file relative to the checkout, e.g. configs/addition_table2.py
  --workdir DIR        workdir on the shared filesystem (relative to the checkout, or absolute)
options:
  --gpus-per-node G    GPUs per node (default 8)
  --per node|gpu       one process per node seeing all its GPUs (default), or one per GPU
  --port PORT          coordinator port on the first node (default 12355)
  --partition P, --account A, --time HH:MM:SS (default 04:00:00), --job-name NAME (default xlt)
  --venv DIR           virtual environment (default $HOME/xlt-venv)
  --no-install         use the venv as it is
  --dry-run            print every command and the sbatch script, run and write nothing
                       (needs no SLURM)
  -h, --help           this text
Arguments after `--` go to xlt.main unchanged.

needs: SLURM (sbatch, srun, scontrol), python3 with venv, NVIDIA driver for CUDA 12, and
network from the login node for pip.

mesh flags (devices = all GPUs of all nodes):
  --config.mesh.data=-1                        every GPU data parallel (the default)
  --config.mesh.fsdp=-1 --config.mesh.data=1   shard parameters over every GPU
  --config.mesh.data=-1 --config.mesh.tensor=G tensor parallel inside each node (G GPUs)
EOF
}

die() { echo "slurm.sh: $*" >&2; echo "run launch/slurm.sh --help for usage" >&2; exit 2; }

nodes="" config="" workdir="" gpus_per_node=8 per=node port=12355 partition="" account=""
time_limit=04:00:00 job_name=xlt venv="$HOME/xlt-venv" install=1 dry_run=0
extra=()
while (($#)); do
  case "$1" in
    --nodes) nodes=${2:?--nodes needs a value}; shift 2 ;;
    --config) config=${2:?--config needs a value}; shift 2 ;;
    --workdir) workdir=${2:?--workdir needs a value}; shift 2 ;;
    --gpus-per-node) gpus_per_node=${2:?--gpus-per-node needs a value}; shift 2 ;;
    --per) per=${2:?--per needs a value}; shift 2 ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --partition) partition=${2:?--partition needs a value}; shift 2 ;;
    --account) account=${2:?--account needs a value}; shift 2 ;;
    --time) time_limit=${2:?--time needs a value}; shift 2 ;;
    --job-name) job_name=${2:?--job-name needs a value}; shift 2 ;;
    --venv) venv=${2:?--venv needs a value}; shift 2 ;;
    --no-install) install=0; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done
for required in nodes config workdir; do
  [[ -n "${!required}" ]] || die "missing required --$required"
done
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$nodes'"
[[ "$gpus_per_node" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node must be a positive integer, got '$gpus_per_node'"
case "$per" in
  node) tasks_per_node=1 ;;
  gpu) tasks_per_node=$gpus_per_node ;;
  *) die "--per must be 'node' or 'gpu', got '$per'" ;;
esac

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/common.sh
source "$repo/launch/common.sh"  # show, run
cd "$repo"

if ((install)); then
  [[ -d "$venv" ]] || run python3 -m venv "$venv"
  run "$venv/bin/pip" install -q -U "jax[cuda12]"
  run "$venv/bin/pip" install -q -e "$repo"
fi

q() { local s; s=$(printf '%q ' "$@"); echo "${s% }"; }
sbatch_options="#SBATCH --job-name=$job_name
#SBATCH --nodes=$nodes
#SBATCH --ntasks-per-node=$tasks_per_node
#SBATCH --gpus-per-node=$gpus_per_node
#SBATCH --time=$time_limit
#SBATCH --output=$repo/runs/slurm/%x-%j.out"
[[ -n "$partition" ]] && sbatch_options+=$'\n'"#SBATCH --partition=$partition"
[[ -n "$account" ]] && sbatch_options+=$'\n'"#SBATCH --account=$account"
# With one process per GPU, each process keeps only its own GPU (SLURM_LOCALID = its
# index on the node), so jax sees one local device per process.
one_gpu=""
# shellcheck disable=SC2016  # expanded in each task
[[ "$per" == gpu ]] && one_gpu='CUDA_VISIBLE_DEVICES=$SLURM_LOCALID '

script="#!/usr/bin/env bash
$sbatch_options
# Written by launch/slurm.sh.
set -euo pipefail
cd $(q "$repo")
source $(q "$venv")/bin/activate
# The allocation's first node coordinates; srun gives every process its rank. (sed, not
# head: head exits early, and with pipefail scontrol's SIGPIPE would fail the job.)
XLT_COORDINATOR=\"\$(scontrol show hostnames \"\$SLURM_JOB_NODELIST\" | sed -n 1p):$port\"
export XLT_COORDINATOR
args=($(q --config="$config" --workdir="$workdir" "${extra[@]}"))
srun --kill-on-bad-exit=1 bash -c '${one_gpu}exec python -m xlt.main \"\$@\" \\
  --coordinator_address=\$XLT_COORDINATOR --num_processes=\$SLURM_NTASKS --process_id=\$SLURM_PROCID' xlt \"\${args[@]}\"
"

path="runs/slurm/$job_name.sbatch"
run mkdir -p runs/slurm
echo "+ cat > $path <<'EOF'"
printf '%s' "$script"
echo "EOF"
((dry_run)) || printf '%s' "$script" > "$path"
run sbatch "$path"
