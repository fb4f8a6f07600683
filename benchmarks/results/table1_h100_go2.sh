#!/bin/bash
set -u
T0=$(date +%s)
export FTTA_DATA_ROOT=$PWD/.gpu/data FTTA_CACHE_DIR=/tmp/ftta_cache PYTHONPATH=$PWD:$PWD/.gpu/site MPLBACKEND=Agg
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
BUDGET=$1
[ -d /tmp/persist ] && cp -rn /tmp/persist/figures . 2>/dev/null
touch /tmp/marker; sleep 1
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS daemon started"
python3 .gpu/pregen.py 16 0 1 2 3 4 2>&1 | tail -1
timeout 150 python3 benchmarks/where_time_goes.py --device cuda --steps 20 --cases bn+local bn+fedavg bn+fedtsa bn+fedctta grad+local grad+fedavg --out $OUT/where_time_goes_cuda.json > $OUT/where_time_goes_cuda.log 2>&1
echo "wtg rc $? at $(( $(date +%s) - T0 )) s"
timeout 100 python3 benchmarks/engine_backends.py --device cuda --out $OUT/engine_backends_cuda.json > $OUT/engine_backends_cuda.log 2>&1
echo "eb rc $? at $(( $(date +%s) - T0 )) s"
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "run-plan with $LEFT s left"
timeout $(( LEFT - 20 )) python3 -m ftta_core run-plan .gpu/plan_grad.jsonl --workers 14 --deadline-s $(( LEFT - 75 )) > $OUT/runplan.log 2>&1
echo "run-plan rc $? after $(( $(date +%s) - T0 )) s"
grep -c '"runs": [1-9]' $OUT/runplan.log
find figures benchmarks -newer /tmp/marker -type f > /tmp/new.txt; wc -l < /tmp/new.txt
tar czf $OUT/results.tgz -T /tmp/new.txt
echo "done $(( $(date +%s) - T0 )) s"
