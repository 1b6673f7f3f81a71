#!/bin/bash
# The torch strategy on a machine with a GPU and a CUDA build of torch: the DDP LeNet example with
# NCCL on one GPU, three ways in turn - `edgetrain run` on the host runtime (MPICH's mpirun, where
# one is on PATH), edgetrain's worker started as Hydra starts it (PMI_RANK, PMI_SIZE), and torchrun;
# then the example's --comm-hook fp16/powersgd and --bucket-cap-mb 1 on NCCL, two Gloo ranks, the
# seed's placeholders, a peer that never joins (named after the 60 s join timeout), and two NCCL
# ranks asked of a one-GPU host.
#   tests/torch_gpu_check.sh DATA_DIR    (DATA_DIR/mnist/ holds mnist.npz or mnist.pkl.gz)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
DATA=$(realpath "${1:?give the folder holding mnist/}")
EX=$PWD/examples
scratch=$(mktemp -d)
# worker RUN_DIR MASTER_PORT HOSTS PROGRAM [ARGS...]: HOSTS each host's name and ranks, [["gpu1",2]]
worker() { python3 -m edgetrain.rank.worker --run-dir "$1" --data "$DATA" --strategy torch \
  --peers "{\"master_addr\":\"127.0.0.1\",\"master_port\":$2,\"iface\":\"\",\"hosts\":$3}" "${@:4}"; }
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
clock() { date +%s.%N; }
took() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f} s from the command')" "$@"; }
for i in 1 2 3; do
  mkdir -p "$scratch/w$i" "$scratch/t$i" "$scratch/r$i"
  if command -v mpirun >/dev/null; then
    echo "--- DDP LeNet, NCCL, 1 rank: edgetrain run (mpirun, host runtime), try $i"
    t0=$(clock)
    (cd "$scratch/r$i" && EDGETRAIN_DATA=$DATA python3 -m edgetrain run "$EX/torch_ddp/train.py" --np 1 --strategy torch -- --epochs 2 --steps-per-epoch 300 2>&1 | grep -E "epoch [0-9]/[0-9]:|accuracy|error")
    took "$t0" "$(clock)"
  fi
  echo "--- DDP LeNet, NCCL, 1 rank: edgetrain's worker, try $i"
  t0=$(clock)
  PMI_RANK=0 PMI_SIZE=1 worker "$scratch/w$i" "2950$i" '[["gpu1",1]]' "$EX/torch_ddp/train.py" -- --epochs 2 --steps-per-epoch 300 | grep -E "epoch|accuracy"
  took "$t0" "$(clock)"
  echo "--- the same under torchrun, try $i"
  t0=$(clock)
  (cd "$scratch/t$i" && EDGETRAIN_DATA=$DATA torchrun --nproc-per-node 1 --master-port "2960$i" "$EX/torch_ddp/train.py" --epochs 2 --steps-per-epoch 300 2>&1 | grep -E "epoch|accuracy")
  took "$t0" "$(clock)"
done
# What the example sends (issue 66's knobs) on NCCL: the fp16 and PowerSGD hooks on CUDA tensors,
# and DDP's buckets at 1 MB, each through the worker, beside the plain allreduce above.
for knob in "--comm-hook fp16" "--comm-hook powersgd" "--bucket-cap-mb 1"; do
  echo "--- DDP LeNet, NCCL, 1 rank, $knob: edgetrain's worker"
  mkdir -p "$scratch/k${knob// /}"; t0=$(clock)
  PMI_RANK=0 PMI_SIZE=1 worker "$scratch/k${knob// /}" 29610 '[["gpu1",1]]' "$EX/torch_ddp/train.py" -- --epochs 2 --steps-per-epoch 300 $knob | grep -E "epoch|accuracy"
  took "$t0" "$(clock)"
done
echo "--- torchrun-style script, Gloo, 2 ranks"
mkdir -p "$scratch/g"
for r in 0 1; do PMI_RANK=$r PMI_SIZE=2 worker "$scratch/g" 29600 '[["gpu1",2]]' "$EX/torchrun_minimal/train.py" >/dev/null 2>&1 & done; wait
cat "$scratch"/g/rank.*.log
echo "--- the seed's placeholders, 2 ranks"
mkdir -p "$scratch/s"
for r in 0 1; do PMI_RANK=$r PMI_SIZE=2 worker "$scratch/s" 29700 '[["gpu1",2]]' "$EX/torch_seed/train.py" -- --dist-url '{master_url}' --dist-rank '{rank}' --world-size '{world_size}' --epochs 1 >/dev/null 2>&1 & done; wait
grep -h epoch "$scratch"/s/rank.*.log
echo "--- a peer that never joins (rank 1 of 2 never starts)"
mkdir -p "$scratch/p"; start=$(date +%s)
PMI_RANK=0 PMI_SIZE=2 worker "$scratch/p" 29800 '[["gpu1",1],["gpu2",1]]' "$EX/torchrun_minimal/train.py" >/dev/null 2>&1
echo "exit $? after $(( $(date +%s) - start )) s: $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["error"])' "$scratch/p/rank.0.failure.json")"
if command -v mpirun >/dev/null; then
  echo "--- two NCCL ranks on a host with $(python3 -c 'import torch; print(torch.cuda.device_count())') GPU(s): edgetrain run --np 2"
  mkdir -p "$scratch/n2"
  (cd "$scratch/n2" && EDGETRAIN_DATA=$DATA timeout 300 python3 -m edgetrain run "$EX/torch_ddp/train.py" --np 2 --strategy torch -- --epochs 1 --steps-per-epoch 50 2>&1 | tail -3; echo "exit ${PIPESTATUS[0]}")
fi
rm -rf "$scratch"
