#!/usr/bin/env bash
# Multi-node smoke test: two network namespaces joined by a veth pair are two "nodes"; each runs
# volt_dist_worker as a plain process with devices=2 (it launches its second rank itself), with
# the reference's variables: MASTER_ADDR = node 0's veth address, MASTER_PORT, WORLD_SIZE=4,
# NODE_RANK 0/1. Checks the collectives (all-reduce results included) and the gradient reducer
# on all 4 ranks; then the Trainer with DdpStrategy (volt_ddp_worker, 2 nodes x 2 ranks, batch 4
# per rank) must end with the weights of one process trained on the global batch of 16, with
# prepare_data run once per node (rank 0 and rank 2, each into its node's folder, while the
# node's other rank waits); a node's preparer killed inside prepare_data ends the other node's
# ranks within the timeout (its heartbeat stops); and
# after a worker of node 1 is killed, both nodes restart and end with the same weights; and the
# same job under a real torchrun on each node (when a python3 with torch exists).
# Exits 77 (ctest: skipped) when namespaces cannot be created.
# With the volt command as a third argument, `volt fit` with pipelines of 4 stages across the
# nodes and of 2 stages on each node (PipelineStrategy), and `volt predict` with a SafetensorsPredictionWriter
# across the nodes: rank 0 merges the 4 ranks' files from a folder both nodes share; when node 1
# writes into a folder of its own (a tmpfs mounted there in its mount namespace, as another
# machine's disk), rank 0 names the rank whose file it cannot see and every rank fails. Last, the
# 2 x 2 Trainer job under real MPI launchers (mpiexec.hydra, mpirun.openmpi) reaching node 1
# through an agent script that enters its namespace.
# Usage: multi_node_netns.sh path/to/volt_dist_worker path/to/volt_ddp_worker [path/to/volt]
set -uo pipefail
usage="usage: multi_node_netns.sh path/to/volt_dist_worker path/to/volt_ddp_worker [path/to/volt]"
worker=${1:?$usage}
ddp_worker=${2:?$usage}
volt=${3:-}
configs=$(cd "$(dirname "$0")/../../configs" && pwd)
tag=$$
ns0=volt_n0_$tag ns1=volt_n1_$tag veth0=vvt0_$tag veth1=vvt1_$tag
addr0=10.213.0.1 addr1=10.213.0.2 port=29611
dir=$(mktemp -d)
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  ip link del "$veth0" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT

# Waits for the two nodes' processes in pids; a non-zero exit fails the test naming `what`.
wait_nodes() {
  local what=$1 i
  for i in 0 1; do
    if ! wait "${pids[$i]}"; then
      echo "FAIL: $what on node $i exited non-zero"
      fail=1
    fi
  done
  pids=()
}

# final_sum ANCHOR RANK FILE...: the |w| sum rank RANK reported at the end ("rank R done step=8
# sum=S") in the files; ANCHOR '^' takes only lines starting with the report, '.*' also lines a
# launcher prefixed (torchrun's "[default0]:").
final_sum() {
  local anchor=$1 rank=$2
  shift 2
  cat "$@" | sed -n "s/${anchor}rank $rank done step=8 sum=\([^ ]*\).*/\1/p"
}

# expect_own_sum RANK SUM WHERE: SUM, rank RANK's final sum in a later job (WHERE), must be the
# one of volt's own launch of the same job (own_sum, filled below) to the last digit.
expect_own_sum() {
  if [ -z "$2" ] || [ "$2" != "${own_sum[$1]}" ]; then
    echo "FAIL: rank $1 weights sum '$2' $3 vs '${own_sum[$1]}' under volt's own launch"
    fail=1
  fi
}

# on_node NODE PORT SECONDS LOG COMMAND...: COMMAND in node NODE's namespace as one node of the
# two-node job (MASTER_ADDR node 0's address, MASTER_PORT PORT, WORLD_SIZE 4, NODE_RANK NODE, no
# rank variables from this shell), killed after SECONDS, output to LOG, in the background; its
# pid is appended to pids for wait_nodes.
on_node() {
  local node=$1 port_=$2 seconds=$3 log=$4 ns=$ns0
  shift 4
  [ "$node" = 1 ] && ns=$ns1
  ip netns exec "$ns" env -u LOCAL_RANK -u RANK -u GLOO_SOCKET_IFNAME \
    MASTER_ADDR=$addr0 MASTER_PORT=$port_ WORLD_SIZE=4 NODE_RANK=$node \
    timeout -s KILL "$seconds" "$@" >"$log" 2>&1 &
  pids+=($!)
}

if ! command -v ip >/dev/null; then
  echo "SKIP: the ip command (iproute2) is missing"
  exit 77
fi
if ! ip netns add "$ns0" 2>"$dir/err"; then
  echo "SKIP: cannot create network namespaces ($(tr '\n' ' ' <"$dir/err")); run as root"
  exit 77
fi
set -e
ip netns add "$ns1"
ip link add "$veth0" type veth peer name "$veth1"
ip link set "$veth0" netns "$ns0"
ip link set "$veth1" netns "$ns1"
ip -n "$ns0" addr add "$addr0/24" dev "$veth0"
ip -n "$ns1" addr add "$addr1/24" dev "$veth1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$veth0" up
ip -n "$ns1" link set "$veth1" up
set +e

fail=0
for scenario in collectives reducer; do
  pids=()
  for node in 0 1; do
    on_node "$node" "$port" 120 "$dir/$scenario.$node.log" \
      "$worker" "$scenario" --devices 2 --nodes 2 --timeout-ms 30000
  done
  wait_nodes "$scenario"
  want="collectives ok"
  [ "$scenario" = reducer ] && want="reducer matches single process"
  for node in 0 1; do
    echo "---- $scenario, node $node ----"
    cat "$dir/$scenario.$node.log"
    for local in 0 1; do
      rank=$((node * 2 + local))
      if ! grep -q "^rank $rank: $want" "$dir/$scenario.$node.log"; then
        echo "FAIL: rank $rank did not report '$want'"
        fail=1
      fi
      if ! grep -q "^rank $rank: pid [0-9]* plain local $local node $node" "$dir/$scenario.$node.log"; then
        echo "FAIL: rank $rank is not local rank $local of node $node"
        fail=1
      fi
    done
  done
done
# The Trainer across the two nodes. Each node has its own root folder (paths may differ between
# nodes); the weights go to one shared prefix, one file per rank.
pids=()
for node in 0 1; do
  on_node "$node" $((port + 1)) 120 "$dir/trainer.$node.log" \
    "$ddp_worker" --root "$dir/node$node" --out "$dir/mn" --devices 2 \
    --nodes 2 --batch 4 --epochs 1 --timeout 30 --prepare-ms 1500
done
timeout -s KILL 120 "$ddp_worker" --root "$dir/ref" --out "$dir/ref" --devices 1 --batch 16 \
  --epochs 1 >"$dir/trainer.ref.log" 2>&1 || { echo "FAIL: the one-process reference failed"; fail=1; }
wait_nodes "trainer"
for f in ref 0 1; do
  echo "---- trainer, $f ----"
  cat "$dir/trainer.$f.log"
done
# prepare_data ran once per node, on its first process (the other rank's setup would have
# thrown had it not waited).
for node in 0 1; do
  got=$(cat "$dir/node$node/prepared" 2>/dev/null)
  if [ "$got" != "rank $((node * 2))" ]; then
    echo "FAIL: node $node's prepare_data log is '$got', not 'rank $((node * 2))'"
    fail=1
  fi
done
ref_sum=$(final_sum '^' 0 "$dir/trainer.ref.log")
own_sum=()  # each rank's final sum under volt's own launch: the later jobs must end on it
for rank in 0 1 2 3; do
  own_sum[rank]=$(final_sum '^' "$rank" "$dir/trainer.0.log" "$dir/trainer.1.log")
  sum=${own_sum[rank]}
  # Every rank holds the same weights; their |w| sum matches the one-process run to rounding
  # (the all-reduce adds the four partial gradients in another order).
  if [ -z "$sum" ] || [ -z "$ref_sum" ] ||
    ! awk -v a="$sum" -v b="$ref_sum" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'; then
    echo "FAIL: rank $rank weights sum '$sum' vs one process '$ref_sum'"
    fail=1
  fi
done
# Node 1's preparer (rank 2, its launching process) dies inside prepare_data: node 0's ranks, which
# wait for it, stop within the timeout (5 s without a heartbeat), naming it; nothing hangs.
pids=()
start=$(date +%s)
for node in 0 1; do
  on_node "$node" $((port + 4)) 60 "$dir/dead.$node.log" \
    "$ddp_worker" --root "$dir/dead$node" --out "$dir/dead" --devices 2 \
    --nodes 2 --batch 4 --epochs 1 --timeout 5 --prepare-ms 1000 --prepare-die 2
done
for i in 0 1; do wait "${pids[$i]}"; done
pids=()
secs=$(($(date +%s) - start))
echo "---- preparer killed, node 0 (${secs} s) ----"
cat "$dir/dead.0.log"
if ! grep -q "rank 2 stopped answering while it ran prepare_data for the others" "$dir/dead.0.log"; then
  echo "FAIL: node 0 did not name rank 2, silent in prepare_data"
  fail=1
fi
if [ "$secs" -gt 40 ]; then
  echo "FAIL: the job took $secs s to end after rank 2 died"
  fail=1
fi
# Elastic restart across the nodes: node 1's worker (rank 3) is SIGKILLed at step 5. Both
# launching processes (max_restarts=1 on each node) relaunch their workers; the ranks meet again
# at the store rank 0 kept serving, under attempt 1's keys, and resume from rank 0's newest last
# checkpoint (step 4) in the folder the nodes share; the weights must equal the run above's.
# Node 0's ranks sleep 0.3 s after each batch, so node 1 re-joins while rank 0 is still in the
# failed attempt: its store must be the one the next attempt uses, under keys of its own.
pids=()
for node in 0 1; do
  slow=(--sleep-ms 300)
  [ "$node" = 1 ] && slow=()
  on_node "$node" $((port + 2)) 150 "$dir/restart.$node.log" \
    "$ddp_worker" --root "$dir/shared" --out "$dir/mnr" --devices 2 \
    --nodes 2 --batch 4 --epochs 1 --timeout 30 --ckpt-every-step 1 --die-rank 3 --die-step 5 \
    --max-restarts 1 "${slow[@]}"
done
wait_nodes "restarted trainer"
for node in 0 1; do
  echo "---- elastic restart, node $node ----"
  cat "$dir/restart.$node.log"
done
# Each node's launching process says that it restarts (node 1's, rank 2, as an error: ranks other
# than 0 print nothing else); its relaunched workers resume below.
grep -q "^\[volt\] warning: \[DdpStrategy\] restart 1 of 1 after" "$dir/restart.0.log" ||
  { echo "FAIL: rank 0 did not restart"; fail=1; }
grep -q "^\[volt rank 2\] error: \[DdpStrategy\] restart 1 of 1 after" "$dir/restart.1.log" ||
  { echo "FAIL: node 1's launching process (rank 2) did not say it restarts"; fail=1; }
grep -q "rank 3 dies at step 5" "$dir/restart.1.log" || { echo "FAIL: rank 3 did not die"; fail=1; }
for rank in 0 1 2 3; do
  node=$((rank / 2))
  if ! grep -q "^rank $rank starts at step 4" "$dir/restart.$node.log"; then
    echo "FAIL: rank $rank did not resume at step 4"
    fail=1
  fi
  expect_own_sum "$rank" "$(final_sum '^' "$rank" "$dir/restart.$node.log")" "after the restart"
done
# volt predict across the nodes with the prediction writer (the 2 x 2 job, 2 batches a rank).
if [ -n "$volt" ]; then
  # predict_on NODE PORT OUT NAME [private]: logs to NAME.NODE.log; `private` mounts a tmpfs
  # over OUT for that node alone.
  predict_on() {
    local node=$1 port_=$2 out=$3 name=$4 private=${5:-}
    local args=(predict --config "$configs/fashion_mnist_mlp.yaml"
      --trainer.enable_progress_bar=false --trainer.devices=2 --trainer.num_nodes=2
      --trainer.limit_predict_batches=2 --trainer.return_predictions=false
      --trainer.default_root_dir="$dir/root_$name$node"
      --trainer.callbacks+=SafetensorsPredictionWriter --trainer.callbacks.2.output_dir="$out")
    local log="$dir/$name.$node.log"
    if [ -n "$private" ]; then
      on_node "$node" "$port_" 60 "$log" sh -c 'mount -t tmpfs volt_private "$1" && shift &&
        exec "$@"' sh "$out" "$volt" "${args[@]}"
    else
      on_node "$node" "$port_" 60 "$log" "$volt" "${args[@]}"
    fi
  }
  pids=()
  for node in 0 1; do predict_on "$node" $((port + 5)) "$dir/pred" predict; done
  wait_nodes "volt predict with a shared output folder"
  for node in 0 1; do
    echo "---- predict, shared folder, node $node ----"
    cat "$dir/predict.$node.log"
  done
  if ! grep -q "predictions of 4 ranks merged into $dir/pred/predictions.safetensors" \
    "$dir/predict.0.log" || [ ! -s "$dir/pred/predictions.safetensors" ] ||
    ls "$dir/pred" | grep -q rank; then
    echo "FAIL: rank 0 did not merge the 4 ranks' predictions into one file"
    fail=1
  fi
  mkdir -p "$dir/private"
  pids=()
  predict_on 0 $((port + 6)) "$dir/private" predict_private
  predict_on 1 $((port + 6)) "$dir/private" predict_private private
  for i in 0 1; do
    if wait "${pids[$i]}"; then
      echo "FAIL: node $i's predict succeeded though rank 0 cannot see node 1's files"
      fail=1
    fi
  done
  pids=()
  for node in 0 1; do
    echo "---- predict, node 1 writing to a folder of its own, node $node ----"
    cat "$dir/predict_private.$node.log"
  done
  if ! grep -q "rank 2 wrote '$dir/private/predictions_rank2.safetensors' but global rank 0 does not see it; with several nodes output_dir must be a folder every node shares" \
    "$dir/predict_private.0.log"; then
    echo "FAIL: rank 0 did not name rank 2's file it cannot see"
    fail=1
  fi
  if ! grep -q "global rank 0 could not merge the ranks' files" "$dir/predict_private.1.log"; then
    echo "FAIL: node 1 did not learn that rank 0's merge failed"
    fail=1
  fi
  # Node 1's launching process reports its worker's exit to a store rank 0 may have closed:
  # quietly (before session 49, c10d printed a "socket has timed out" line ten times a second).
  if grep -q "socket has timed out" "$dir/predict_private.1.log"; then
    echo "FAIL: node 1 printed c10d's connection timeouts"
    fail=1
  fi
  # Pipeline parallelism across the nodes (`volt fit --trainer.strategy=pipeline`, the demo
  # MLP's layers in a volt::Pipeline): a 4-stage pipeline whose activations cross the veth pair
  # ends with one process's metrics (the same printed validation loss); 2 replicas of a 2-stage
  # pipeline, one per node, train too.
  pipe_args=(fit --config "$configs/fashion_mnist_mlp.yaml" --model.pipeline_chunks=1
    --trainer.enable_progress_bar=false --trainer.max_epochs=1 --trainer.limit_train_batches=4
    --trainer.limit_val_batches=2 --trainer.strategy=pipeline)
  "$volt" "${pipe_args[@]}" --trainer.default_root_dir="$dir/pipe_one" >"$dir/pipe_one.log" 2>&1 ||
    { echo "FAIL: the one-process pipeline fit failed"; cat "$dir/pipe_one.log"; fail=1; }
  for stages in 4 2; do
    pids=()
    for node in 0 1; do
      on_node "$node" $((port + 6 + stages)) 90 "$dir/pipe$stages.$node.log" "$volt" \
        "${pipe_args[@]}" --trainer.devices=2 --trainer.num_nodes=2 \
        --trainer.strategy.init_args.stages=$stages --trainer.default_root_dir="$dir/pipe$stages.$node"
    done
    wait_nodes "volt fit with $stages-stage pipelines"
    echo "---- pipeline, $stages stages, node 0 ----"
    cat "$dir/pipe$stages.0.log"
  done
  want=$(grep -E '^ +val_loss ' "$dir/pipe_one.log" || true)
  got=$(grep -E '^ +val_loss ' "$dir/pipe4.0.log" || true)
  if [ -z "$want" ] || [ "$got" != "$want" ]; then
    echo "FAIL: the 4-stage pipeline across the nodes printed '$got', one process '$want'"
    fail=1
  fi
  if ! grep -q "2 replicas of a 2-stage pipeline" "$dir/pipe2.0.log"; then
    echo "FAIL: stages=2 on 4 ranks did not make 2 replicas of a 2-stage pipeline"
    fail=1
  fi
else
  echo "SKIP (predict and pipeline parts): no volt command given"
fi

# The same 2 x 2 job started by a real torchrun on each node (static rendezvous: node 0's agent
# hosts the store at MASTER_PORT, every volt rank joins it), when a python3 with torch exists.
source "$(dirname "$0")/torchrun_env.sh"
if [ -z "$python" ]; then
  echo "SKIP (torchrun part only): no python3 with torch"
else
  for node in 0 1; do
    ns=$ns0
    [ "$node" = 1 ] && ns=$ns1
    ip netns exec "$ns" env -u LOCAL_RANK -u RANK -u GLOO_SOCKET_IFNAME -u MASTER_ADDR \
      -u MASTER_PORT -u WORLD_SIZE -u NODE_RANK timeout -s KILL 150 "$python" \
      -m torch.distributed.run --nnodes 2 --node_rank "$node" --nproc_per_node 2 \
      --master_addr "$addr0" --master_port $((port + 3)) "${torchrun_output[@]}" \
      --log_dir "$dir/torchrun_logs_$node" --no_python "$ddp_worker" --root "$dir/tr$node" \
      --out "$dir/mnt" --devices 2 --nodes 2 --batch 4 --epochs 1 --timeout 30 \
      >"$dir/torchrun.$node.log" 2>&1 &
    pids+=($!)
  done
  wait_nodes "torchrun"
  for node in 0 1; do
    echo "---- torchrun, node $node ----"
    grep -v "^ *File \|^ *^" "$dir/torchrun.$node.log"
  done
  for rank in 0 1 2 3; do
    sum=$(final_sum '.*' "$rank" "$dir/torchrun.0.log" "$dir/torchrun.1.log")
    if [ -z "$sum" ] ||
      ! awk -v a="$sum" -v b="$ref_sum" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }'; then
      echo "FAIL: under torchrun, rank $rank weights sum '$sum' vs one process '$ref_sum'"
      fail=1
    fi
  done
fi

# The same 2 x 2 job under real MPI launchers (Debian's mpich and openmpi-bin), started in node
# 0's namespace with both nodes as hosts. A launcher reaches a remote host through its agent
# (ssh for Hydra, rsh for Open MPI); here the agent is a script that enters that host's
# namespace. The ranks read the launcher's variables (the node is the block of ranks), meet at
# MASTER_ADDR (node 0) and must end with the weights of volt's own launch above, to the last bit.
agent=$dir/enter_node.sh
cat >"$agent" <<AGENT
#!/usr/bin/env bash
# Called as "[-x] HOST COMMAND...", as ssh would be: runs COMMAND in HOST's namespace.
[ "\$1" = -x ] && shift
case "\$1" in
  $addr0) ns=$ns0 ;;
  $addr1) ns=$ns1 ;;
  *) echo "enter_node: unknown host \$1" >&2; exit 1 ;;
esac
shift
exec ip netns exec "\$ns" bash -c "\$*"
AGENT
chmod +x "$agent"
mpi_launchers=()
for launcher in mpiexec.hydra mpirun.openmpi; do
  if command -v "$launcher" >/dev/null; then
    mpi_launchers+=("$launcher")
  else
    echo "SKIP ($launcher part only): $launcher is not installed (scripts/setup.sh installs it)"
  fi
done
mpi_port=$((port + 11))
for launcher in "${mpi_launchers[@]}"; do
  mpi_port=$((mpi_port + 1))
  if [ "$launcher" = mpiexec.hydra ]; then
    mpi=(mpiexec.hydra -hosts "$addr0,$addr1" -ppn 2 -launcher ssh -launcher-exec "$agent"
      -genv MASTER_ADDR "$addr0" -genv MASTER_PORT "$mpi_port")
  else
    mpi=(mpirun.openmpi --allow-run-as-root --host "$addr0:2,$addr1:2" -n 4
      --mca plm_rsh_agent "$agent" -x MASTER_ADDR="$addr0" -x MASTER_PORT="$mpi_port")
  fi
  log=$dir/$launcher.log
  ip netns exec "$ns0" env -u LOCAL_RANK -u RANK -u GLOO_SOCKET_IFNAME -u MASTER_ADDR \
    -u MASTER_PORT -u WORLD_SIZE -u NODE_RANK timeout -s KILL 150 "${mpi[@]}" \
    "$ddp_worker" --root "$dir/$launcher" --out "$dir/$launcher/w" --devices 2 --nodes 2 \
    --batch 4 --epochs 1 --timeout 30 >"$log" 2>&1
  code=$?
  echo "---- $launcher across the nodes (exit $code) ----"
  cat "$log"
  [ "$code" = 0 ] || { echo "FAIL: $launcher across the nodes exited $code"; fail=1; }
  for rank in 0 1 2 3; do
    expect_own_sum "$rank" "$(final_sum '.*' "$rank" "$log")" "under $launcher"
  done
done
[ "$fail" = 0 ] && echo "multi-node over network namespaces (collectives, reducer, Trainer, elastic restart, predict, torchrun, MPI launchers): OK"
exit "$fail"
