#!/bin/bash
# Call 3 on the idle GPU: FedTSA rounds in step / ahead (64 per batch, the default on a GPU) / ahead 1 and 16 per batch
set -u
timeout 220 python3 benchmarks/fedtsa_rounds_ahead.py --device cuda --threads 16 --steps 100 --repeats 1 \
  --rounds-per-batch 1 16 || echo "fedtsa_rounds_ahead stopped: $?"
