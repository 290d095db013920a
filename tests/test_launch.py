"""The launch scripts: --help, --dry-run (the commands, in order, with no cloud tools
installed), clear errors on missing arguments, the SLURM job script run against fake
SLURM commands, and shellcheck when it is installed; and the command they all run, xlt.main:
its flag errors are one line and exit status 2."""

import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from conftest import REPO

LAUNCH = REPO / "launch"
SCRIPTS = ("tpu.sh", "slurm.sh", "gpu.sh")
EXAMPLES = {
    "tpu.sh": ["--name", "xlt-v4", "--zone", "us-central2-b", "--config", "configs/graph.py",
               "--workdir", "runs/graph"],
    "slurm.sh": ["--nodes", "2", "--gpus-per-node", "4", "--config", "configs/graph.py", "--workdir", "runs/graph"],
    "gpu.sh": ["--config", "configs/graph.py", "--workdir", "runs/graph"],
}


def launch(script, *args, env=None):
  # An empty PATH apart from the basics: a dry run must not need gcloud, sbatch or ssh.
  return subprocess.run(["bash", str(LAUNCH / script), *args], capture_output=True, text=True, timeout=60,
                        env=env or {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")})


def commands(out: str) -> list[str]:
  return [line[2:] for line in out.splitlines() if line.startswith("+ ")]


def first(lines: list[str], pattern: str) -> int:
  hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
  assert hits, f"no command matches {pattern!r} in:\n" + "\n".join(lines)
  return hits[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_says_usage_needs_and_mesh_flags(script):
  r = launch(script, "--help")
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith(f"usage: launch/{script}")
  for want in ("needs:", "mesh flags", "--config.mesh.data=-1", "--config.mesh.fsdp", "--dry-run"):
    assert want in r.stdout, want


@pytest.mark.parametrize("script", SCRIPTS)
def test_missing_required_argument_is_a_clear_error(script):
  args = EXAMPLES[script]
  without_config = [a for i, a in enumerate(args) if "--config" not in (a, args[i - 1] if i else "")]
  r = launch(script, *without_config, "--dry-run")
  assert r.returncode == 2
  assert "missing required --config" in r.stderr and not r.stdout
  r = launch(script, *args, "--no-such-flag", "--dry-run")
  assert r.returncode == 2 and "unknown argument '--no-such-flag'" in r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_invented_repository_address(script):
  text = (LAUNCH / script).read_text()
  assert "git clone" not in text and "github.com" not in text


def test_tpu_dry_run_creates_copies_installs_runs_copies_back_deletes():
  r = launch("tpu.sh", *EXAMPLES["tpu.sh"], "--dry-run", "--", "--config.num_seeds=1")
  assert r.returncode == 0, r.stderr
  lines = commands(r.stdout)
  order = [first(lines, r"tpu-vm create xlt-v4 --zone=us-central2-b --accelerator-type=v4-8"),
           first(lines, r"git ls-files .*\| tar "),  # this checkout, not a clone
           first(lines, r"tpu-vm scp \S+\.tar\.gz xlt-v4:xlt\.tar\.gz .*--worker=all"),
           first(lines, r"tpu-vm ssh xlt-v4 .*--worker=all .*pip install .*jax\[tpu\].*pip install -q -e \."),
           first(lines, r"tpu-vm ssh xlt-v4 .*--worker=all .*python3 -m xlt\.main --config=configs/graph\.py "
                        r"--workdir=runs/graph --config\.num_seeds=1"),
           first(lines, r"tpu-vm scp --recurse xlt-v4:xlt/runs/graph runs/tpu_xlt-v4 .*--worker=0"),
           first(lines, r"tpu-vm delete xlt-v4 --zone=us-central2-b --quiet")]
  assert order == sorted(order) and len(set(order)) == 7, lines
  assert lines[-1].startswith("gcloud compute tpus tpu-vm delete")
  assert "coordinator" not in r.stdout  # TPU VMs find each other


def test_tpu_keep_existing_and_absolute_workdir():
  args = [a if a != "runs/graph" else "/mnt/shared/graph" for a in EXAMPLES["tpu.sh"]]
  r = launch("tpu.sh", *args, "--existing", "--keep", "--dry-run")
  assert r.returncode == 0, r.stderr
  lines = commands(r.stdout)
  assert not any(" create " in l or " delete " in l for l in lines)
  assert any(re.search(r"--workdir=/mnt/shared/graph", l) for l in lines)
  assert "gcloud compute tpus tpu-vm scp --recurse xlt-v4:/mnt/shared/graph runs/tpu_xlt-v4 --zone=us-central2-b --worker=0" in lines


def sbatch_script(out: str) -> str:
  return out.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0] + "\n"


def test_slurm_dry_run_installs_then_submits_a_job_with_the_derived_flags():
  r = launch("slurm.sh", *EXAMPLES["slurm.sh"], "--partition", "gpu", "--dry-run", "--", "--config.num_seeds=1")
  assert r.returncode == 0, r.stderr
  lines = commands(r.stdout)
  assert first(lines, r"pip install .*jax\[cuda12\]") < first(lines, r"pip install -q -e ") < first(
      lines, r"^sbatch runs/slurm/xlt\.sbatch$")
  job = sbatch_script(r.stdout)
  for want in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
               "#SBATCH --partition=gpu", 'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p',
               "--coordinator_address=$XLT_COORDINATOR", "--num_processes=$SLURM_NTASKS",
               "--process_id=$SLURM_PROCID", "srun "):
    assert want in job, want


def _fake(bin_dir, name, body):
  path = bin_dir / name
  path.write_text("#!/usr/bin/env bash\n" + body)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("per,gpu_env", [("node", None), ("gpu", "3")])
def test_slurm_job_script_gives_each_process_its_rank(tmp_path, per, gpu_env):
  """Runs the written job script with fake scontrol/srun/python: the flags xlt.main gets are
  the first node's address, the task count and the task's rank."""
  r = launch("slurm.sh", *EXAMPLES["slurm.sh"], "--per", per, "--port", "4321", "--venv", str(tmp_path / "venv"),
             "--no-install", "--dry-run", "--", "--config.name=a b")
  assert r.returncode == 0, r.stderr
  bin_dir = tmp_path / "bin"
  (tmp_path / "venv" / "bin").mkdir(parents=True)
  (tmp_path / "venv" / "bin" / "activate").write_text("")
  bin_dir.mkdir()
  _fake(bin_dir, "scontrol", 'echo node-a; for i in $(seq 20000); do echo node-$i; done\n')  # a large allocation
  # one task of the step: rank 3 of 8 (options before the command are srun's own)
  _fake(bin_dir, "srun", 'while [[ "$1" == -* ]]; do shift; done\n'
                         'SLURM_NTASKS=8 SLURM_PROCID=3 SLURM_LOCALID=3 "$@"\n')
  _fake(bin_dir, "python", 'printf "%s\\n" "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}" "$@"\n')
  job = tmp_path / "job.sbatch"
  job.write_text(sbatch_script(r.stdout))
  out = subprocess.run(["bash", str(job)], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "node-[a-b]"})
  assert out.returncode == 0, out.stderr
  assert out.stdout.splitlines() == [
      f"CUDA_VISIBLE_DEVICES={gpu_env or 'unset'}", "-m", "xlt.main", "--config=configs/graph.py",
      "--workdir=runs/graph", "--config.name=a b", "--coordinator_address=node-a:4321", "--num_processes=8",
      "--process_id=3"]


def test_gpu_dry_run_local_and_over_ssh():
  r = launch("gpu.sh", *EXAMPLES["gpu.sh"], "--dry-run", "--", "--config.mesh.devices=1")
  assert r.returncode == 0, r.stderr
  (line,) = commands(r.stdout)
  assert re.search(r"python3 -m venv .*pip install -q -U \"jax\[cuda12\]\" && pip install -q -e \. && "
                   r".*python -m xlt\.main --config=configs/graph\.py --workdir=runs/graph "
                   r"--config\.mesh\.devices=1", line), line
  r = launch("gpu.sh", *EXAMPLES["gpu.sh"], "--host", "me@gpu-box", "--dry-run")
  assert r.returncode == 0, r.stderr
  lines = commands(r.stdout)
  order = [first(lines, r"git ls-files .*\| tar "), first(lines, r"^scp \S+ me@gpu-box:xlt\.tar\.gz"),
           first(lines, r"^ssh me@gpu-box .*tar -xzf"), first(lines, r"^ssh me@gpu-box .*python -m xlt\.main"),
           first(lines, r"^scp -r me@gpu-box:xlt/runs/graph runs/gpu_gpu-box$")]
  assert order == sorted(order), lines


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck():
  r = subprocess.run(["shellcheck", "-x", *(f"launch/{s}" for s in SCRIPTS), "launch/common.sh"], cwd=REPO,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr


FAKE_GCLOUD = r'''
echo "gcloud $*" >> "$LOG"
shift 3  # compute tpus tpu-vm
verb=$1; shift
case "$verb" in
  scp)
    paths=()
    for a in "$@"; do [[ "$a" == --* ]] || paths+=("$a"); done
    src=${paths[0]} dst=${paths[1]}
    if [[ "$src" == *:* ]]; then cp -r "$FAKE_HOME/${src#*:}" "$dst"; else cp "$src" "$FAKE_HOME/${dst#*:}"; fi ;;
  ssh)
    for a in "$@"; do
      if [[ "$a" == --command=* ]]; then (cd "$FAKE_HOME" && HOME=$FAKE_HOME bash -c "${a#--command=}"); fi
    done ;;
esac
'''
FAKE_PYTHON = r'''
echo "python3 $*" >> "$LOG"
if [[ "$1 $2" == "-m xlt.main" ]]; then
  for a in "$@"; do
    if [[ "$a" == --workdir=* ]]; then mkdir -p "${a#--workdir=}" && echo "[]" > "${a#--workdir=}/results.json"; fi
  done
fi
'''


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="tpu.sh ships the checkout's git-known files")
def test_tpu_run_against_a_fake_gcloud_ships_the_checkout_and_brings_results_back(tmp_path):
  """A real (not dry) run, where gcloud's ssh and scp act on a local folder standing in for
  the workers: the checkout arrives unpacked, xlt.main runs in it with the given flags, and
  the workdir comes back."""
  bin_dir, home = tmp_path / "bin", tmp_path / "worker_home"
  bin_dir.mkdir()
  home.mkdir()
  _fake(bin_dir, "gcloud", FAKE_GCLOUD)
  _fake(bin_dir, "python3", FAKE_PYTHON)
  env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "LOG": str(tmp_path / "log"),
         "FAKE_HOME": str(home), "TMPDIR": str(tmp_path)}
  r = launch("tpu.sh", *EXAMPLES["tpu.sh"], "--results", str(tmp_path / "results"), "--",
             "--config.name=a b", env=env)
  assert r.returncode == 0, r.stdout + r.stderr
  assert (home / "xlt" / "xlt" / "main.py").read_bytes() == (REPO / "xlt" / "main.py").read_bytes()
  assert (home / "xlt" / "launch" / "tpu.sh").exists() and not (home / "xlt" / ".git").exists()
  assert (tmp_path / "results" / "graph" / "results.json").exists()
  log = (tmp_path / "log").read_text().splitlines()
  verbs = [line.split()[4] if line.startswith("gcloud") else line.split()[2] for line in log]
  assert verbs == ["create", "scp", "ssh", "pip", "pip", "ssh", "xlt.main", "scp", "delete"], log
  assert log[6] == "python3 -m xlt.main --config=configs/graph.py --workdir=runs/graph --config.name=a b"
  assert not list(tmp_path.glob("xlt_checkout.*"))  # the local tarball is removed


FAKE_SSH = r'''
echo "ssh $*" >> "$LOG"
cd "$FAKE_HOME" && HOME=$FAKE_HOME bash -c "$2"
'''
FAKE_SCP = r'''
echo "scp $*" >> "$LOG"
[[ "$1" == -r ]] && shift
if [[ "$1" == *:* ]]; then
  src=${1#*:}; [[ "$src" == /* ]] || src="$FAKE_HOME/$src"; cp -r "$src" "$2"
else
  cp "$1" "$FAKE_HOME/${2#*:}"
fi
'''
FAKE_VENV_PYTHON = r'''
echo "python3 $*" >> "$LOG"
if [[ "$1" == -m && "$2" == venv ]]; then mkdir -p "$3/bin" && : > "$3/bin/activate"; fi
'''


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="gpu.sh --host ships the checkout's git-known files")
@pytest.mark.parametrize("remote", [False, True])
def test_gpu_run_against_fake_tools(tmp_path, remote):
  """gpu.sh for real, with ssh/scp acting on a local folder and fake python3/pip/python:
  venv, install, run with the flags given, results back."""
  bin_dir, home = tmp_path / "bin", tmp_path / "host_home"
  bin_dir.mkdir()
  home.mkdir()
  for name, body in (("ssh", FAKE_SSH), ("scp", FAKE_SCP), ("python3", FAKE_VENV_PYTHON),
                     ("pip", 'echo "pip $*" >> "$LOG"\n'), ("python", FAKE_PYTHON.replace("python3", "python"))):
    _fake(bin_dir, name, body)
  env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home if not remote else tmp_path), "LOG": str(tmp_path / "log"),
         "FAKE_HOME": str(home), "TMPDIR": str(tmp_path)}
  workdir = str(tmp_path / "run")
  where = ["--host", "me@box", "--results", str(tmp_path / "results")] if remote else []
  r = launch("gpu.sh", "--config", "configs/graph.py", "--workdir", workdir, *where, "--", "--config.seed=1", env=env)
  assert r.returncode == 0, r.stdout + r.stderr
  log = (tmp_path / "log").read_text().splitlines()
  assert [l for l in log if not l.startswith(("ssh", "scp"))] == [
      f"python3 -m venv {home}/xlt-venv", "pip install -q -U jax[cuda12]", "pip install -q -e .",
      f"python -m xlt.main --config=configs/graph.py --workdir={workdir} --config.seed=1"]
  assert (tmp_path / "run" / "results.json").exists()
  if remote:
    assert (home / "xlt" / "xlt" / "main.py").exists()
    assert (tmp_path / "results" / "run" / "results.json").exists()


@pytest.mark.parametrize("flag,want", [
    ("--config.nonexistent=1", "--config.nonexistent: the config has no field 'nonexistent' (the fields of the config:"),
    ("--config.train.stepz=1", "--config.train.stepz: the config has no field 'train.stepz' (nearest: 'train.steps')"),
    ("--config.train.steps=abc", "--config.train.steps=abc: invalid literal for int()"),
    ("--no_such_flag", "Unknown command line flag 'no_such_flag'"),
])
@pytest.mark.parametrize("where", ["repo", "elsewhere"])
def test_flag_errors_of_xlt_main_are_one_line_and_exit_2(tmp_path, flag, want, where):
  # errors while flags are parsed are user errors like any other: one line, exit 2, nothing
  # written; from another directory the config (which imports configs.common) loads all the same
  config = "configs/graph.py" if where == "repo" else str(REPO / "configs" / "graph.py")
  r = subprocess.run([sys.executable, "-m", "xlt.main", f"--config={config}", f"--workdir={tmp_path / 'w'}",
                      flag], cwd=REPO if where == "repo" else tmp_path, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, r.stderr
  assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(f"xlt: error: {want}"), r.stderr
  assert not (tmp_path / "w").exists()


def test_a_config_file_that_raises_is_one_line_without_a_class_name(tmp_path):
  config = tmp_path / "raising.py"
  config.write_text("def get_config():\n  raise ValueError('pick a base model first')\n")
  r = subprocess.run([sys.executable, "-m", "xlt.main", f"--config={config}", f"--workdir={tmp_path / 'w'}"],
                     cwd=REPO, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and r.stderr.splitlines() == [r.stderr.strip()], r.stderr
  assert r.stderr.startswith("xlt: error: ") and r.stderr.strip().endswith(": pick a base model first"), r.stderr
  assert "ValueError" not in r.stderr


def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path):
  for args in (["--config=configs/no_such.py"], ["--config=configs/no_such.py", "--config.train.steps=3"]):
    r = subprocess.run([sys.executable, "-m", "xlt.main", *args, f"--workdir={tmp_path}"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "xlt: error: --config=configs/no_such.py: no such config file\n"
