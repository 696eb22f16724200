#!/usr/bin/env bash
# Issue 24's GPU checks in one call on a lent GPU machine (see docs/performance.md):
#   1. the client pool's equivalence tests with models, data and cohorts on CUDA;
#   2. one FedAvg round of 100 and of 1000 clients, vectorised vs loop vs a centralised epoch,
#      all on the GPU (bench/simulation.py), with a profile of each path's round.
# Expects, in the repository root, .gpu/whl (wheels of the protocol layer's packages for the
# machine's Python) and .gpu/fmnist (Fashion-MNIST's idx files). Results land in $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
nvidia-smi -L; python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())'
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SECURE_FL_FASHION_MNIST=$PWD/.gpu/fmnist
SECURE_FL_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    tests/secure_fl/test_pool.py tests/secure_fl/test_runtime.py -k "pool or cuda or torch_global" \
    2>&1 | tee "$OUT/pytest.txt" | tail -25
for clients in 100 1000; do
  timeout 200 python3 bench/simulation.py --device cuda --clients "$clients" --repeats 5 --profile \
      >"$OUT/sim$clients.json" 2>"$OUT/profile$clients.txt"
  echo "rc=$? clients=$clients"; cat "$OUT/sim$clients.json"
done
