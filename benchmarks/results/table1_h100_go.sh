#!/bin/bash
# usage: bash .gpu/go.sh PLAN WORKERS BUDGET_S  (on the device machine, repo root)
set -u
T0=$(date +%s)
export FTTA_DATA_ROOT=$PWD/.gpu/data FTTA_CACHE_DIR=/tmp/ftta_cache PYTHONPATH=$PWD:$PWD/.gpu/site MPLBACKEND=Agg
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
PLAN=$1; WORKERS=$2; BUDGET=$3; SEEDS=${4:-"0 1 2 3 4"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__)"
# results made earlier on this (warm) machine come back into the tree
[ -d /tmp/persist ] && cp -rn /tmp/persist/figures . 2>/dev/null
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
  if timeout 60 python3 -c "import torch; torch.zeros(1, device='cuda'); print('cuda ok under MPS')"; then :; else
    echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; echo "MPS off"; fi
else echo "no nvidia-cuda-mps-control"; fi
touch /tmp/marker; sleep 1
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader -l 20 > $OUT/gpu_util.log 2>&1 &
python3 .gpu/pregen.py 16 $SEEDS 2>&1 | tail -2
echo "after pregen: $(( $(date +%s) - T0 )) s"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
timeout $(( LEFT - 25 )) python3 -m ftta_core run-plan $PLAN --workers $WORKERS --deadline-s $(( LEFT - 110 )) > $OUT/runplan.log 2>&1
echo "run-plan rc $? after $(( $(date +%s) - T0 )) s"
grep -c '"runs": [1-9]' $OUT/runplan.log; grep -i error $OUT/runplan.log | head -5; tail -3 $OUT/runplan.log
find figures -newer /tmp/marker -type f > /tmp/new.txt; wc -l < /tmp/new.txt
tar czf $OUT/results.tgz -T /tmp/new.txt
mkdir -p /tmp/persist && tar cf - -T /tmp/new.txt | tar xf - -C /tmp/persist
echo "done $(( $(date +%s) - T0 )) s"
