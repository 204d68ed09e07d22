#!/usr/bin/env bash
# Real-data runs behind the README's FEMNIST / Fashion-MNIST rows.
# Usage: bash benchmarks/femnist_fmnist.sh [OUT_ROOT] [FEMNIST_ROUNDS] [FMNIST_ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/real_data}
femnist_rounds=${2:-200}
fmnist_rounds=${3:-50}
data=${DATA_ROOT:-../shared/data}
run() { name=$1; shift
  python3 -m uv run --quiet python run_experiment.py --seed=0 --progress=false --overwrite \
    --output_dir="$out/$name" "$@"; }
run femnist_fedavg   --algo=fedavg   --task=femnist --data_dir="$data/femnist_leaf" --rounds="$femnist_rounds"
run femnist_fedgroup --algo=fedgroup --task=femnist --data_dir="$data/femnist_leaf" --rounds="$femnist_rounds" --num_groups=5
run fmnist_fedavg    --algo=fedavg   --task=fmnist  --data_dir="$data/fashion_mnist" --rounds="$fmnist_rounds"
