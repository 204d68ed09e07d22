#!/usr/bin/env bash
# One call on a lent GPU host (JAX and CUDA, no TensorFlow): every export that
# `gpu_hlo_round.py prepare --root=ROOT` wrote here is compiled and timed on
# the GPU with TF's products as written (TF32 allowed) and with float32
# products, then the Dense-model rounds on the host's CPUs as well. Writes
# OUT/gpu.csv, OUT/cpu.csv, OUT/results.tgz (each export's JSON) and
# OUT/host.txt (the card, driver and JAX).
#
#   bash benchmarks/gpu_hlo_device.sh ROOT OUT
set -u
root=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
cd "$(dirname "$0")"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
  nproc; } > "$out/host.txt" 2>&1
cat "$out/host.txt"
mkdir -p "$out/json"
python3 gpu_hlo_round.py run --root="$root" --results="$out/json" --csv="$out/gpu.csv" \
  --precisions=default,highest --backends=gpu --warmup=3 --repeats=10
python3 gpu_hlo_round.py run --root="$root" --results="$out/json" --csv="$out/cpu.csv" \
  --only=femnist20_seq,femnist20_par20,femnist20_par5,syn20_seq,syn20_par20 \
  --precisions=default --backends=cpu --warmup=1 --repeats=5
tar czf "$out/results.tgz" -C "$out" json && rm -r "$out/json"
