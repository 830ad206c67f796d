#!/usr/bin/env bash
# A Ray cluster of several nodes on this one machine: a head plus N worker nodes, to try
# hardware=multinode and launch/submit.sh without real machines.
#
#   launch/local_cluster.sh                                   # head + 2 worker nodes, 1 CPU each
#   launch/local_cluster.sh --gpus-per-node 1                 # one GPU per worker node (CUDA_VISIBLE_DEVICES split)
#   launch/local_cluster.sh --dashboard                       # also the dashboard (Jobs API) on 127.0.0.1:8265
#   launch/local_cluster.sh stop                              # stops this cluster, and only this one
#
# Every node gets its own temp dir under --temp-dir and random ports (except the head's
# --port, --client-port and --dashboard-port): several nodes, and other Ray instances,
# share the host. `stop` kills the processes that name that temp dir, never every Ray
# process on the machine as `ray stop` would.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RAY=${RAY:-$(command -v ray || echo "$ROOT/.venv/bin/ray")}

usage() {
  cat <<USAGE
usage: launch/local_cluster.sh [start] [options]
       launch/local_cluster.sh stop|status [--temp-dir DIR] [--port PORT]

options:
  --num-workers N       worker nodes besides the head (default 2)
  --cpus-per-node N     Ray CPUs of every node, head included (default 1)
  --gpus-per-node N     GPUs of every worker node (default 0); node i gets its own CUDA_VISIBLE_DEVICES
  --port PORT           the head's GCS port (default 6379)
  --dashboard           start the dashboard and Jobs API on 127.0.0.1 (needed by launch/submit.sh)
  --dashboard-port P    dashboard port (default 8265)
  --client-port P       the head's Ray Client server port (default 10001; Ray will not turn it off)
  --temp-dir DIR        root of the nodes' temp dirs and logs (default /tmp/evora-ray; keep it short:
                        Ray's socket paths must fit in 107 characters)

examples:
  launch/local_cluster.sh --dashboard
  launch/submit.sh --address http://127.0.0.1:8265 hardware=multinode model=qwen2_5_0_5b task=countdown
  RAY_ADDRESS=127.0.0.1:6379 evora hardware=multinode hardware.gpus_per_worker=0 hardware.num_workers=2 hardware.cpu_threads_per_worker=1 hardware.gpu_memory_utilization=0.05 hardware.kv_cache_gib=1
  launch/local_cluster.sh stop
USAGE
}

die() { echo "local_cluster.sh: error: $*" >&2; exit 1; }

command=start
case "${1:-}" in start|stop|status) command=$1; shift ;; esac
num_workers=2 cpus=1 gpus=0 port=6379 dashboard=false dashboard_port=8265 client_port=10001 temp_dir=/tmp/evora-ray
while (($#)); do
  case "$1" in
    --num-workers) num_workers=${2:?--num-workers needs a number}; shift 2 ;;
    --cpus-per-node) cpus=${2:?--cpus-per-node needs a number}; shift 2 ;;
    --gpus-per-node) gpus=${2:?--gpus-per-node needs a number}; shift 2 ;;
    --port) port=${2:?--port needs a number}; shift 2 ;;
    --dashboard) dashboard=true; shift ;;
    --dashboard-port) dashboard_port=${2:?--dashboard-port needs a number}; shift 2 ;;
    --client-port) client_port=${2:?--client-port needs a number}; shift 2 ;;
    --temp-dir) temp_dir=${2:?--temp-dir needs a directory}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for number in "$num_workers" "$cpus" "$gpus" "$port" "$dashboard_port" "$client_port"; do
  [[ $number =~ ^[0-9]+$ ]] || die "'$number' is not a whole number"
done
[[ -x $RAY || -n $(command -v "$RAY") ]] || die "ray not found; run make setup, or set RAY=/path/to/ray"
mkdir -p "$temp_dir"
temp_dir=$(cd "$temp_dir" && pwd -P)  # absolute, no trailing slash: it is matched in command lines
address=127.0.0.1:$port

# Ray 2.60 turns token authentication on for a head when a token exists, but worker nodes
# (`ray start --address`) and `ray status` only send it when RAY_AUTH_MODE=token is set.
# Keep it on (the GCS listens on every interface): make a token the way ray.init() does.
if [[ -z ${RAY_AUTH_MODE:-} ]]; then
  if [[ -z ${RAY_AUTH_TOKEN:-} && ! -f ${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token} && $command == start ]]; then
    "$RAY" get-auth-token --generate >/dev/null 2>&1 || die "could not create a Ray auth token (ray get-auth-token)"
  fi
  export RAY_AUTH_MODE=token
fi

# PIDs of this cluster: processes with an argument "...=$temp_dir/...", plus their
# descendants (Ray workers rename themselves to ray::IDLE and lose their arguments).
cluster_pids() {
  local table pid ppid args found=() grew=1
  table=$(ps -axww -o pid=,ppid=,args=)
  while read -r pid ppid args; do
    [[ $args == *"=$temp_dir/"* ]] && found+=("$pid")
  done <<<"$table"
  ((${#found[@]})) || return 0
  while ((grew)); do
    grew=0
    while read -r pid ppid args; do
      if [[ " ${found[*]} " == *" $ppid "* && " ${found[*]} " != *" $pid "* ]]; then found+=("$pid"); grew=1; fi
    done <<<"$table"
  done
  echo "${found[@]}"
}

stop_cluster() {
  local pids
  pids=$(cluster_pids)
  if [[ -z $pids ]]; then echo "no Ray processes of $temp_dir are running"; return 0; fi
  # shellcheck disable=SC2086  # a list of PIDs
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 20); do
    pids=$(cluster_pids)
    [[ -z $pids ]] && break
    sleep 0.5
  done
  # shellcheck disable=SC2086
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
  echo "stopped the Ray cluster of $temp_dir (logs stay in $temp_dir/*/session_latest/logs)"
}

alive_nodes() {  # `ray status` lists every alive node as "1 node_<id>" under "Active:"
  "$RAY" status --address "$address" 2>/dev/null | grep -cE '^\s+1 node_' || true
}

case $command in
  stop) stop_cluster; exit 0 ;;
  status) exec "$RAY" status --address "$address" ;;
esac

[[ -z $(cluster_pids) ]] || die "a cluster of $temp_dir is running: launch/local_cluster.sh stop --temp-dir $temp_dir"
# Ports left to Ray (0, or not given) are picked at random, so nodes on one host do not collide.
# `ray start` swaps 127.0.0.1 for this host's address (what other nodes would reach); the GCS
# listens on every interface, hence the token above. The dashboard binds to 127.0.0.1.
common=(--node-ip-address 127.0.0.1 --num-cpus "$cpus" --dashboard-agent-listen-port 0 --disable-usage-stats)
head=(--head --port "$port" --num-gpus 0 --ray-client-server-port "$client_port" --include-dashboard="$dashboard")
[[ $dashboard == true ]] && head+=(--dashboard-host 127.0.0.1 --dashboard-port "$dashboard_port")
fail() { echo "local_cluster.sh: error: $*; stopping what started" >&2; stop_cluster >&2; exit 1; }

"$RAY" start "${head[@]}" "${common[@]}" --temp-dir "$temp_dir/head" >"$temp_dir/head.log" 2>&1 \
  || fail "the head did not start: $(tail -n 1 "$temp_dir/head.log") (log: $temp_dir/head.log)"
for ((i = 1; i <= num_workers; i++)); do
  visible=()
  if ((gpus > 0)); then  # node i sees its own GPUs, otherwise every node would hand out GPU 0
    visible=(CUDA_VISIBLE_DEVICES="$(seq -s, $(((i - 1) * gpus)) $((i * gpus - 1)))")
  fi
  env ${visible[@]+"${visible[@]}"} "$RAY" start --address "$address" --num-gpus "$gpus" "${common[@]}" \
    --temp-dir "$temp_dir/worker-$i" >"$temp_dir/worker-$i.log" 2>&1 \
    || fail "worker node $i did not start: $(tail -n 1 "$temp_dir/worker-$i.log") (log: $temp_dir/worker-$i.log)"
done

for _ in $(seq 60); do  # nodes register with the head within seconds
  (($(alive_nodes) == num_workers + 1)) && break
  sleep 1
done
nodes=$(alive_nodes)
((nodes == num_workers + 1)) || fail "only $nodes of $((num_workers + 1)) nodes came up (logs: $temp_dir/*.log)"

# Engine workers on CPU nodes: the CPU engine settings of conf/hardware/cpu.yaml, spread like multinode.
overrides="hardware=multinode"
((gpus > 0)) || overrides+=" hardware.gpus_per_worker=0 hardware.num_workers=$num_workers hardware.cpu_threads_per_worker=1 hardware.gpu_memory_utilization=0.05 hardware.kv_cache_gib=1"
echo "Ray cluster up: $nodes nodes on this machine (head + $num_workers workers), temp dir $temp_dir"
if [[ $dashboard == true ]]; then  # the Jobs API; not in RAY_ADDRESS, where ray.init would read http:// as Ray Client
  echo "  launch/submit.sh --address http://127.0.0.1:$dashboard_port $overrides tracking.out_dir=$PWD/runs"
fi
echo "  RAY_ADDRESS=$address evora $overrides"
echo "  launch/local_cluster.sh stop --temp-dir $temp_dir"
