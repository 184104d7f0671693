#!/usr/bin/env bash
# volt under a real torchrun (Debian's python3-torch 1.13, `python3 -m torch.distributed.run`),
# two workers of volt_ddp_worker (2 epochs, batch 8 per rank, a last checkpoint every step):
#  1. torchrun's default static rendezvous: its agent hosts the store at MASTER_PORT and says so
#     (TORCHELASTIC_USE_AGENT_STORE=True); rank 0 must join that store, not host one;
#  2. --standalone (c10d rendezvous): rank 0 hosts the workers' store;
#  3. --max_restarts=1 with rank 1 SIGKILLed at step 5: torchrun restarts both workers
#     (TORCHELASTIC_RESTART_COUNT=1), they meet under attempt 1's keys in the agent's store and
#     resume from the newest last checkpoint (step 4); without a ModelCheckpoint the attempt
#     starts over, with a warning.
# Each must end with the weights of the same job launched by volt itself, to the last bit.
#  4. the `volt` CLI failing under torchrun (a bad config on both workers): each worker writes
#     its typed error to TORCHELASTIC_ERROR_FILE, so torchrun's failure summary names the file
#     and shows volt's message as the traceback instead of "error_file: <N/A>".
# Exits 77 (ctest: skipped) when no python3 has torch.
# Usage: torchrun.sh path/to/volt_ddp_worker path/to/volt
set -uo pipefail
ddp_worker=${1:?usage: torchrun.sh path/to/volt_ddp_worker path/to/volt}
volt=${2:?usage: torchrun.sh path/to/volt_ddp_worker path/to/volt}
source "$(dirname "$0")/torchrun_env.sh"
if [ -z "$python" ]; then
  echo "SKIP: no python3 with torch (Debian's python3-torch, which scripts/setup.sh installs)"
  exit 77
fi
# The workers train on the CPU over Gloo (ctest passes the build's answer).
if [ "${VOLT_BUILD_HAS_GLOO:-1}" != 1 ]; then
  echo "SKIP: this build has no Gloo process group (libtorch without gloo headers, e.g. the CUDA wheels)"
  exit 77
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# torchrun sets OMP_NUM_THREADS=1 in its workers; the reference run gets the same.
export OMP_NUM_THREADS=1
common=(--devices 2 --batch 8 --epochs 2 --ckpt-every-step 1 --timeout 20)
source "$(dirname "$0")/free_port.sh"
run_torchrun() {
  local name=$1
  shift
  timeout -s KILL 150 "$python" -m torch.distributed.run --nproc_per_node=2 \
    "${torchrun_output[@]}" --log_dir "$dir/torchrun_logs_$name" "$@" >"$dir/$name.log" 2>&1
}
sums() {
  grep -o "rank [01] done step=[0-9]* sum=[^ ]*" "$1" | sort
}

fail=0
timeout -s KILL 150 "$ddp_worker" --root "$dir/ref" --out "$dir/ref/w" "${common[@]}" \
  >"$dir/ref.log" 2>&1 || { echo "FAIL: the run volt launched itself failed"; fail=1; }
want=$(sums "$dir/ref.log")
echo "---- volt's own launcher ----"
cat "$dir/ref.log"

run_torchrun static --master_port "$(free_port)" --no_python "$ddp_worker" --root "$dir/static" \
  --out "$dir/static/w" "${common[@]}"
code_static=$?
run_torchrun standalone --standalone --no_python "$ddp_worker" --root "$dir/standalone" \
  --out "$dir/standalone/w" "${common[@]}"
code_standalone=$?
run_torchrun restart --master_port "$(free_port)" --max_restarts 1 --monitor_interval 1 \
  --no_python "$ddp_worker" --root "$dir/restart" --out "$dir/restart/w" "${common[@]}" \
  --die-rank 1 --die-step 5
code_restart=$?
# The same restart without a ModelCheckpoint: the attempt starts over (with a warning saying how
# to resume instead) and, trained from the same seed, ends with the same weights.
run_torchrun restart_from_scratch --master_port "$(free_port)" --max_restarts 1 \
  --monitor_interval 1 --no_python "$ddp_worker" --root "$dir/scratch" --out "$dir/scratch/w" \
  --devices 2 --batch 8 --epochs 2 --timeout 20 --die-rank 1 --die-step 5
code_restart_from_scratch=$?

# Fails at its config on both workers (exit 2): nothing trains, so it costs a few seconds.
run_torchrun cli_error --master_port "$(free_port)" --no_python "$volt" fit \
  --model=MlpClassifier --model.lr=-1 --trainer.devices=2 --trainer.strategy=ddp \
  --trainer.default_root_dir="$dir/cli_error"
code_cli_error=$?
echo "---- torchrun, cli_error (exit $code_cli_error) ----"
cat "$dir/cli_error.log"
if [ "$code_cli_error" = 0 ] ||
  ! grep -q "error_file: $dir/torchrun_logs_cli_error/.*/error.json" "$dir/cli_error.log" ||
  ! grep -q "traceback : volt::ConfigError: \[MlpClassifier\] lr=-1 must be a positive number" \
    "$dir/cli_error.log" || ! grep -q "exitcode  : 2" "$dir/cli_error.log" ||
  grep -q "error_file: <N/A>" "$dir/cli_error.log"; then
  echo "FAIL: torchrun's summary of a failed volt CLI does not show volt's error from its error file"
  fail=1
fi

for name in static standalone restart restart_from_scratch; do
  code_var=code_$name
  echo "---- torchrun, $name (exit ${!code_var}) ----"
  cat "$dir/$name.log"
  if [ "${!code_var}" != 0 ]; then
    echo "FAIL: torchrun ($name) exited ${!code_var}"
    fail=1
  fi
  got=$(sums "$dir/$name.log")
  if [ -z "$want" ] || [ "$got" != "$want" ]; then
    echo "FAIL: torchrun ($name) ended with '$got', volt's own launcher with '$want'"
    fail=1
  fi
done
for phrase in "rank 1 dies at step 5" "rank 0 starts at step 4" "rank 1 starts at step 4"; do
  if ! grep -q "$phrase" "$dir/restart.log"; then
    echo "FAIL: torchrun (restart) did not print '$phrase'"
    fail=1
  fi
done
if ! grep -q "no last checkpoint was found" "$dir/restart_from_scratch.log" ||
  ! grep -q "rank 1 starts at step 0" "$dir/restart_from_scratch.log"; then
  echo "FAIL: torchrun (restart_from_scratch) did not warn and start over"
  fail=1
fi
[ "$fail" = 0 ] &&
  echo "torchrun (agent store, standalone, restart after a lost rank, error file): OK"
exit "$fail"
