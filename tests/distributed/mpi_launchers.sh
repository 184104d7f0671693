#!/usr/bin/env bash
# volt under real MPI launchers (Debian's mpich and openmpi-bin, which scripts/setup.sh installs):
# mpiexec starts every process, volt reads its rank from the launcher's variables (MPICH / Intel
# MPI's Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS; Open MPI's mpirun:
# OMPI_COMM_WORLD_*) and meets the others over Gloo at MASTER_ADDR:MASTER_PORT. No MPI library is
# linked: the launchers only start processes.
#  1. three ranks of volt_dist_worker's collectives under each launcher: each rank names the
#     launcher it detected and its local rank, and the collectives pass;
#  2. two ranks of volt_ddp_worker (2 epochs, batch 8 per rank) under each launcher end with the
#     weights of the same job launched by volt itself, to the last bit;
#  3. rank 1 SIGKILLed at step 5 under each launcher: the job ends, with a failure, within the
#     bound (rank 0 does not hang in its all-reduce);
#  4. the `volt` CLI with a bad config under mpiexec: every rank prints volt's typed error and
#     the launcher reports failure.
# Exits 77 (ctest: skipped) when neither launcher is installed or the build has no Gloo.
# Usage: mpi_launchers.sh path/to/volt_dist_worker path/to/volt_ddp_worker path/to/volt
set -uo pipefail
dist_worker=${1:?usage: mpi_launchers.sh volt_dist_worker volt_ddp_worker volt}
ddp_worker=${2:?usage: mpi_launchers.sh volt_dist_worker volt_ddp_worker volt}
volt=${3:?usage: mpi_launchers.sh volt_dist_worker volt_ddp_worker volt}
if [ "${VOLT_BUILD_HAS_GLOO:-1}" != 1 ]; then
  echo "SKIP: this build has no Gloo process group (libtorch without gloo headers, e.g. the CUDA wheels)"
  exit 77
fi
unset VOLT_BUILD_HAS_GLOO  # ctest's answer for this script; the workers would warn about it
launchers=()
command -v mpiexec.hydra >/dev/null && launchers+=(mpich)
command -v mpirun.openmpi >/dev/null && launchers+=(openmpi)
if [ ${#launchers[@]} = 0 ]; then
  echo "SKIP: neither mpiexec.hydra (Debian's mpich) nor mpirun.openmpi (openmpi-bin) is" \
    "installed; scripts/setup.sh installs both"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
source "$(dirname "$0")/free_port.sh"
# mpi <launcher> <ranks> <program> [args...]: the program under that launcher, on this machine,
# with a fresh MASTER_PORT (Hydra passes the environment on; Open MPI only what -x names).
mpi() {
  local launcher=$1 n=$2
  shift 2
  export MASTER_ADDR=127.0.0.1 MASTER_PORT
  MASTER_PORT=$(free_port)
  case "$launcher" in
    mpich) timeout -s KILL 150 mpiexec.hydra -n "$n" "$@" ;;
    # Open MPI refuses root without these; --oversubscribe: more ranks than this machine's cores.
    openmpi)
      timeout -s KILL 150 mpirun.openmpi --allow-run-as-root --oversubscribe -n "$n" \
        -x MASTER_ADDR -x MASTER_PORT -x OMP_NUM_THREADS "$@"
      ;;
  esac
}
sums() {
  grep -o "rank [01] done step=[0-9]* sum=[^ ]*" "$1" | sort
}
fail=0
export OMP_NUM_THREADS=1
common=(--devices 2 --batch 8 --epochs 2 --timeout 20)

timeout -s KILL 150 "$ddp_worker" --root "$dir/ref" --out "$dir/ref/w" "${common[@]}" \
  >"$dir/ref.log" 2>&1 || { echo "FAIL: the run volt launched itself failed"; fail=1; }
want=$(sums "$dir/ref.log")
echo "---- volt's own launcher ----"
cat "$dir/ref.log"

for launcher in "${launchers[@]}"; do
  log=$dir/$launcher.collectives.log
  mpi "$launcher" 3 "$dist_worker" collectives --devices 3 >"$log" 2>&1
  code=$?
  echo "---- $launcher: collectives on 3 ranks (exit $code) ----"
  cat "$log"
  [ "$code" = 0 ] || { echo "FAIL: $launcher: collectives exited $code"; fail=1; }
  for r in 0 1 2; do
    if ! grep -q "rank $r: pid [0-9]* $launcher local $r node 0" "$log" ||
      ! grep -q "rank $r: collectives ok" "$log"; then
      echo "FAIL: $launcher: rank $r did not detect $launcher (local rank $r) and pass"
      fail=1
    fi
  done

  log=$dir/$launcher.train.log
  mpi "$launcher" 2 "$ddp_worker" --root "$dir/$launcher" --out "$dir/$launcher/w" \
    "${common[@]}" >"$log" 2>&1
  code=$?
  echo "---- $launcher: DDP training on 2 ranks (exit $code) ----"
  cat "$log"
  got=$(sums "$log")
  if [ "$code" != 0 ] || [ -z "$want" ] || [ "$got" != "$want" ]; then
    echo "FAIL: $launcher: ended with '$got' (exit $code), volt's own launcher with '$want'"
    fail=1
  fi

  log=$dir/$launcher.killed.log
  start=$(date +%s)
  mpi "$launcher" 2 "$ddp_worker" --root "$dir/$launcher.killed" --out "$dir/$launcher.killed/w" \
    "${common[@]}" --die-rank 1 --die-step 5 >"$log" 2>&1
  code=$?
  took=$(($(date +%s) - start))
  echo "---- $launcher: rank 1 killed at step 5 (exit $code after $took s) ----"
  cat "$log"
  # A hung job is killed by mpi's timeout (150 s): the bound of 60 s catches it. (Open MPI
  # exits 137 itself, 128 + the rank's SIGKILL.)
  if [ "$code" = 0 ] || ! grep -q "rank 1 dies at step 5" "$log" || [ "$took" -gt 60 ]; then
    echo "FAIL: $launcher: a killed rank did not end the job with a failure within 60 s"
    fail=1
  fi
done

# Fails at its config on both ranks (exit 2): nothing trains, so it costs a second.
log=$dir/cli_error.log
mpi "${launchers[0]}" 2 "$volt" fit --model=MlpClassifier --model.lr=-1 --trainer.devices=2 \
  --trainer.strategy=ddp --trainer.default_root_dir="$dir/cli_error" >"$log" 2>&1
code=$?
echo "---- ${launchers[0]}: the CLI with a bad config (exit $code) ----"
cat "$log"
if [ "$code" = 0 ] || [ "$(grep -c "\[MlpClassifier\] lr=-1 must be a positive number" "$log")" != 2 ]; then
  echo "FAIL: ${launchers[0]}: the CLI's config error did not reach both ranks' output and fail the job"
  fail=1
fi

[ "$fail" = 0 ] && echo "MPI launchers (${launchers[*]}: collectives, DDP equal to volt's own launcher, a killed rank, a CLI error): OK"
exit "$fail"
