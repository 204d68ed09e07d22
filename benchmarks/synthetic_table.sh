#!/usr/bin/env bash
# Reproduces the README's Synthetic(1,1) results table (paper setting: 100 clients,
# 20 clients per round, 10 local epochs, batch 10, lr 0.01, m = 5, 200 rounds).
# Usage: bash benchmarks/synthetic_table.sh [OUT_ROOT]   (about 35 min on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/synthetic_table}
run() { name=$1; shift
  python3 -m uv run --quiet python run_experiment.py --task=synthetic --seed=0 \
    --progress=false --overwrite --output_dir="$out/$name" "$@"; }
run fedavg           --algo=fedavg
run fedprox          --algo=fedprox --mu=1
run fedgroup_edc     --algo=fedgroup --measure=edc
run fedgroup_madc    --algo=fedgroup --measure=madc
run fedgrouprox_edc  --algo=fedgrouprox --measure=edc --mu=1
run fedgroup_rcc     --algo=fedgroup --measure=edc --cold_start=rcc
run fedgroup_rac     --algo=fedgroup --measure=edc --cold_start=rac
python3 - "$out" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
print("| run | max test acc | final test acc | s/round | group sizes |")
print("|---|---|---|---|---|")
for d in sorted(p for p in root.iterdir() if (p / "summary.json").exists()):
  s = json.loads((d / "summary.json").read_text())
  print(f"| {d.name} | {s['max_test_accuracy']:.4f} | {s['final_test_accuracy']:.4f} | "
        f"{s['mean_round_seconds']:.2f} | {s.get('group_sizes', '')} |")
PY
