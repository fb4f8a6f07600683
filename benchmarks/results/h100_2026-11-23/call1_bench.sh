#!/bin/bash
set -u
timeout 200 python3 benchmarks/fedtsa_rounds_ahead.py --device cuda --threads 16 --steps 40 --repeats 1 || echo "fedtsa_rounds_ahead stopped: $?"
