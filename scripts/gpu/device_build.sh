#!/usr/bin/env bash
# Step 2 of a GPU run, ON the GPU machine from the project root, with .gpu/ (scripts/gpu/prepare.sh)
# carried along: unpacks the carried Debian packages into /tmp/volt-deps, builds volt against
# the machine's own torch (a CUDA wheel) into build-gpu/ and runs ctest. Extra arguments go to
# ctest (e.g. `-R Cuda`); TARGETS="a b" builds only those targets; NO_TESTS=1 skips ctest;
# CMAKE_ARGS adds configure arguments (e.g. "-DVOLT_CUDA_GRAPHS=OFF").
# Logs (configure, build, ctest) go to $OUT (default /tmp/out).
set -u
root=$(pwd)
g=$root/.gpu
out=${OUT:-/tmp/out}
mkdir -p "$out"
exec > >(tee "$out/device_build.log") 2>&1
nvidia-smi -L
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)'
tp=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
deps=/tmp/volt-deps
if [ ! -d $deps ]; then
  mkdir -p $deps
  for f in "$g"/debs/*.deb; do
    case $f in
      *dataset-fashion-mnist*) dpkg -x "$f" / ;;  # the tests look for it where Debian puts it
      *) dpkg -x "$f" $deps ;;
    esac
  done
fi
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# Also for the configure steps tests run themselves (install_consumer).
export CMAKE_PREFIX_PATH="$tp:$deps/usr"
t0=$(date +%s)
# shellcheck disable=SC2086
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tp;$deps/usr" ${CMAKE_ARGS:-} \
  > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
grep -E "^-- volt" "$out/configure.log"
cmake --build build-gpu -j"$(nproc)" ${TARGETS:+--target $TARGETS} -- -k 0 > "$out/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(($(date +%s) - t0)) s"
[ $rc -eq 0 ] || grep -E "error" "$out/build.log" | head -40
if [ -z "${NO_TESTS:-}" ]; then
  (cd build-gpu && ctest -j12 --timeout 300 --output-on-failure "$@" > "$out/ctest.log" 2>&1)
  echo "ctest rc=$?"
  grep -E "tests passed|\(Failed\)|\(Timeout\)|Not Run|\(Subprocess" "$out/ctest.log" | head -40
fi
exit $rc
