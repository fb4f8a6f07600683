#!/bin/bash
# Run planned CIFAR-10-C runs on a lent GPU machine inside one command's time limit, then pack the new results.
#   bash benchmarks/device_run.sh BUDGET_S PLAN [ALONE_PLAN] [BENCH_SCRIPT]
# BUNDLE (default .gpu) is the folder written by benchmarks/device_bundle.py and carried with the command; PLAN and
# ALONE_PLAN are FTTA_PLAN files inside the checkout. Steps: the CIFAR-10-C cache for seeds 0-4 (16 processes, ~30
# s; skipped when a warm machine already has it); ALONE_PLAN, if given, with one worker on an otherwise idle GPU (its
# summaries' wall_time_s are clean protocol timings, e.g. one FedTSA run); BENCH_SCRIPT, if given, also on the idle
# GPU (e.g. benchmarks/device_benchmarks.sh); the MPS daemon (~4x more runs per minute, benchmarks/README.md); PLAN
# with 14 workers, none started after BUDGET_S - HOLD_S (default 110 s); every new file under figures/ and
# benchmarks/ into $OUT/results.tgz. Results of earlier calls on the same warm machine are restored first, so a
# second call with the same PLAN goes on where the first stopped.
set -u
T0=$(date +%s)
BUDGET=$1; PLAN=$2; ALONE=${3:-}; BENCH=${4:-}; BUNDLE=${BUNDLE:-.gpu}; HOLD=${HOLD_S:-110}
export FTTA_DATA_ROOT=$PWD/$BUNDLE/data FTTA_CACHE_DIR=/tmp/ftta_cache PYTHONPATH=$PWD:$PWD/$BUNDLE/site
export MPLBACKEND=Agg PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
[ -d /tmp/persist ] && cp -a /tmp/persist/. . && echo "restored $(find /tmp/persist -type f | wc -l) files of earlier calls"
[ -d $BUNDLE/cache ] && mkdir -p $FTTA_CACHE_DIR && cp -a $BUNDLE/cache/. $FTTA_CACHE_DIR/  # EATA's Fisher draws
touch /tmp/marker; sleep 1
if [ ! -f /tmp/ftta_cache/.pregen_done ]; then
  python3 benchmarks/results/table1_h100_pregen.py 16 0 1 2 3 4 2>&1 | tail -1 && touch /tmp/ftta_cache/.pregen_done
fi
echo "pregen done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -n "$ALONE" ]; then
  timeout 300 python3 -m ftta_core run-plan "$ALONE" --workers 1 > $OUT/alone.runplan.log 2>&1
  echo "alone rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/alone.runplan.log
fi
if [ -n "$BENCH" ]; then bash "$BENCH"; echo "bench done at $(( $(date +%s) - T0 )) s"; fi
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d 2>/dev/null && echo "MPS daemon started"
(while true; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader >> $OUT/gpu_util.log; sleep 20; done) &
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
echo "run-plan with $LEFT s left"
timeout $(( LEFT - 20 )) python3 -m ftta_core run-plan "$PLAN" --workers 14 --deadline-s $(( LEFT - HOLD )) > $OUT/runplan.log 2>&1
echo "run-plan rc $? after $(( $(date +%s) - T0 )) s"
grep -c '"runs": [1-9]' $OUT/runplan.log; grep -c '"skipped"' $OUT/runplan.log; grep '"error"' $OUT/runplan.log | head -3
find figures benchmarks -newer /tmp/marker -type f > /tmp/new.txt; wc -l < /tmp/new.txt
tar czf $OUT/results.tgz -T /tmp/new.txt
mkdir -p /tmp/persist && tar cf - -T /tmp/new.txt | tar xf - -C /tmp/persist
echo "done $(( $(date +%s) - T0 )) s"
