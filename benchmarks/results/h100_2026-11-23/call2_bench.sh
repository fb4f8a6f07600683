#!/bin/bash
# Call 2 on the idle GPU: the full FedTSA protocol (Table 1 NIID, TTA-bn, seed 0) with batched rounds ahead, timed,
# then the rounds-ahead benchmark (in step / ahead with 64 rounds per batch / ahead with 1).
set -u
mkdir -p $OUT/protocol
T0=$SECONDS; timeout 240 python3 -m ftta_core run --dataset cifar10 --scenario fedtsa_niid --clients 20 --local bn \
  --strategy fedtsa --seed 0 --device cuda --out $OUT/protocol/fedtsa_bn_niid_seed0 > $OUT/protocol/log.txt 2>&1
echo "protocol rc $? in $((SECONDS - T0)) s"; tail -c 600 $OUT/protocol/log.txt
python3 - <<'PY'
import json, os
s = json.load(open(os.environ["OUT"] + "/protocol/fedtsa_bn_niid_seed0/summary.json"))
print({k: s.get(k) for k in ("accuracy", "accuracy_local", "wall_time_s", "threads", "server_threads", "device")})
PY
timeout 200 python3 benchmarks/fedtsa_rounds_ahead.py --device cuda --threads 16 --steps 100 --repeats 1 \
  --rounds-per-batch 1 || echo "fedtsa_rounds_ahead stopped: $?"
