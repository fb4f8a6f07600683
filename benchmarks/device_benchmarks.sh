#!/bin/bash
# The GPU benchmarks of benchmarks/README.md in one go, each under its own time limit (run by device_run.sh before
# the MPS daemon starts, so each has the GPU to itself): client scaling 10..1000, the server cost of FedCTTA vs
# FedTSA, the engine backends, and FedTSA's rounds computed ahead vs in their step (Table 1 config, 100 steps).
set -u
timeout ${SCALING_S:-150} python3 benchmarks/client_scaling.py --device cuda --steps 5 || echo "client_scaling stopped: $?"
timeout ${SERVER_S:-150} python3 benchmarks/server_cost.py --device cuda || echo "server_cost stopped: $?"
timeout ${BACKENDS_S:-60} python3 benchmarks/engine_backends.py --device cuda --steps 20 || echo "engine_backends stopped: $?"
timeout ${AHEAD_S:-240} python3 benchmarks/fedtsa_rounds_ahead.py --device cuda --threads 16 --steps 100 --repeats 1 || echo "fedtsa_rounds_ahead stopped: $?"
