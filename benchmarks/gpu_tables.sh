#!/usr/bin/env bash
# Tables 2 and 3 of the language-mixing paper at the reference's size (not `:cpu`: its sample
# counts, 9-digit operands, its 12x128 model and batch 1024) on one lent GPU, writing to $1:
#   bash benchmarks/gpu_tables.sh OUT_DIR [TABLE2_BUDGET_S] [TABLE3_BUDGET_S]
# Evaluation is sparse (every 1,000 steps, patience 2) so the device time goes to training; each
# table runs under its own time limit and keeps the points that finished (a grid skips finished
# points when rerun with the same workdir). XLT_TABLES_TINY=1 runs the same commands at a tiny
# size, on a CPU, in about a minute (tests/test_gpu_tables.py).
set -u
out=${1:?output folder}; t2_s=${2:-300}; t3_s=${3:-150}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1
sparse=(--config.train.eval_every=1000 --config.train.patience=2)
t2=(); t3=()
if [ "${XLT_TABLES_TINY:-0}" = 1 ]; then
  tiny=(--config.train.steps=4 --config.train.eval_every=2 --config.train.min_steps=0 --config.num_seeds=1
        --config.model.num_layers=1 --config.model.d_model=32 --config.model.num_heads=2)
  sparse=("${tiny[@]}")
  t2=(--points=standard+letter --config.train.batch_size=8 --config.addition.num_test=16 --config.addition.num_val=8)
  t3=(--points=diff_grammar_m256 --config.train.batch_size=8 --config.graph.num_test_pairs=16
      --config.graph.num_val_pairs=8)
fi
run() {  # name, budget, config, flags...
  local name=$1 budget=$2 config=$3; shift 3
  timeout -s INT "$budget" python3 -m xlt.main --config="$config" --workdir="$work/$name" "${sparse[@]}" "$@" \
    > "$out/$name.log" 2>&1
  echo "$name exit: $?" >> "$out/$name.log"
  cp "$work/$name/results.json" "$out/$name.results.json" 2>/dev/null
  tar -czf "$out/$name.tgz" -C "$work" --exclude='*.npz' --exclude='ckpt' --exclude='tb' \
    --exclude='predictions.jsonl' "$name" 2>/dev/null
}
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
run table2 "$t2_s" configs/addition_table2.py "${t2[@]}"
run table3 "$t3_s" configs/graph_table3.py "${t3[@]}"
ls -la "$out"
