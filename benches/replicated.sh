#!/usr/bin/env bash
# The label server on replicated Redis under wrk, as a user would run it: a primary and its
# replica (or a cluster of three primaries with a replica each) started fresh on free ports,
# the server started the moment they are up (the replica usually still in its first sync),
# then a run of wrk with every request a new key. Each row is measured with the default
# replica wait and with `--wait-for-replicas 0`, at each connection count, each on servers of
# its own; then one run with the default wait in which the replica is killed and started
# again a third of the way in (it resyncs). Prints creates/s, p50/p99/max latency and the
# non-2xx answers (with wrk's socket errors: timeouts, resets), and the ratio of each
# default row to its wait-off row.
#
# A second binary (the label server built from an earlier commit, say) is measured beside
# the current one in the same run, turn by turn, when BEFORE names it.
#
# usage: bash benches/replicated.sh [seconds per run, default 30] [server|cluster, default server]
#        [connection counts, default "8 32 256"; "" for the replica-restart rows alone]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
topology=${2:-server}
counts=${3-8 32 256}
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install -y wrk"; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is needed"; exit 1; }

cargo build --release --quiet --example label_server --features redis
binaries=("after=target/release/examples/label_server")
if [[ -n ${BEFORE:-} ]]; then binaries=("before=$BEFORE" "${binaries[@]}"); fi

free_port() { # below 55536: a cluster node's bus listens 10,000 ports higher
  python3 -c 'import random, socket
while True:
    port = random.randint(20000, 45000)
    try:
        for offset in (0, 10000):
            s = socket.socket(); s.bind(("127.0.0.1", port + offset)); s.close()
        print(port); break
    except OSError:
        pass'
}
work=$(mktemp -d)
pids=()
stop_all() { # the servers started here, and replicas started again in the background (by pid file)
  local pid
  for pid in "${pids[@]}" $(cat "$work"/run-*/*/pid 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  pids=(); rm -rf "$work"/run-*
}
trap 'stop_all; rm -rf "$work"' EXIT

cat >"$work/distinct.lua" <<'LUA'
local prefix = tostring(os.time()) .. tostring(math.random(1000000))
local counter = 0
local thread_id = 0
setup = function(thread) thread_id = thread_id + 1; thread:set("id", thread_id) end
request = function()
  counter = counter + 1
  local key = "k-" .. prefix .. "-" .. (id or 0) .. "-" .. counter
  local body = '{"request_id":"' .. key .. '","parcel_id":"parcel-42"}'
  return wrk.format("POST", "/labels", {["Content-Type"] = "application/json", ["Idempotency-Key"] = key}, body)
end
LUA

wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done; echo "port $1 never opened"; return 1; }

redis() { # port dir [args…]: a redis-server with Redis' own defaults, no persistence
  local port=$1 dir=$2; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" "$@" >"$dir/log" 2>&1 &
  pids+=($!); disown $!
  echo $! >"$dir/pid"
}

store_url="" replica_dir="" replica_port=""
servers() { # starts fresh Redis servers; sets store_url, and replica_dir/replica_port for one server
  local run=$work/run-$RANDOM$RANDOM
  if [[ $topology == server ]]; then
    local primary; primary=$(free_port); replica_port=$(free_port); replica_dir=$run/replica
    redis "$primary" "$run/primary"
    wait_port "$primary"
    redis "$replica_port" "$replica_dir" --replicaof 127.0.0.1 "$primary"
    wait_port "$replica_port"
    store_url="redis://127.0.0.1:$primary"
  else
    local ports=() seeds=()
    for i in 1 2 3 4 5 6; do
      local port; port=$(free_port); ports+=("$port"); seeds+=("127.0.0.1:$port")
      redis "$port" "$run/node-$port" --cluster-enabled yes --cluster-config-file "$run/node-$port/nodes.conf"
    done
    for port in "${ports[@]}"; do wait_port "$port"; done
    redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
    for _ in $(seq 200); do
      [[ $(redis-cli -p "${ports[0]}" cluster info | tr -d '\r' | grep cluster_state) == cluster_state:ok ]] && break
      sleep 0.05
    done
    store_url="redis-cluster://$(IFS=,; echo "${seeds[*]}")"
  fi
}

server_port=""
label_server() { # binary [flags…]
  local binary=$1; shift
  server_port=$(free_port)
  "$binary" --addr "127.0.0.1:$server_port" --store "$store_url" "$@" >"$work/server.log" 2>&1 &
  pids+=($!); disown $!
  wait_port "$server_port" || { tail -5 "$work/server.log"; exit 1; }
}

row() { # name connections restart(0|1) binary [flags…]: one wrk run on fresh servers
  local name=$1 connections=$2 restart=$3 binary=$4; shift 4
  servers
  label_server "$binary" "$@"
  if ((restart)); then
    ( sleep "$((seconds / 3))"
      kill -9 "$(cat "$replica_dir/pid")" 2>/dev/null || true
      redis "$replica_port" "$replica_dir" --replicaof 127.0.0.1 "${store_url##*:}" ) &
    local restarter=$!
  fi
  wrk -t2 -c"$connections" -d"${seconds}s" --timeout 5s --latency -s "$work/distinct.lua" \
    "http://127.0.0.1:$server_port" >"$work/wrk.out" 2>&1 || true
  if ((restart)); then wait "$restarter" || true; fi
  python3 - "$name" "$connections" "$work/wrk.out" <<'PY'
import re, sys
name, connections, path = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
def ms(value):
    found = re.match(r"([\d.]+)(us|ms|s|m)$", value)
    if not found:
        return float("nan")
    number, unit = found.groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]
rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
if not rate:
    print(f"| {name} | -c{connections} | wrk failed: {text.strip()[-200:]!r} |")
    sys.exit(0)
rate = float(rate.group(1))
latency = re.search(r"Latency\s+(\d\S*)\s+(\S+)\s+(\S+)", text)
p50 = re.search(r"^\s+50%\s+(\S+)", text, re.M).group(1)
p99 = re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1)
non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
errors = sum(int(n) for n in errors.groups()) if errors else 0
print(f"| {name} | -c{connections} | {rate:,.0f} | {ms(p50):.2f} | {ms(p99):.2f} | {ms(latency.group(3)):.1f} | {int(non2xx.group(1)) if non2xx else 0} | {errors} |")
PY
  stop_all
}

echo "$topology: wrk -t2 -c{$counts} -d${seconds}s, every request a new key; servers started fresh for each row"
echo
echo "| binary, wait | connections | creates/s | p50 ms | p99 ms | max ms | non-2xx | socket errors |"
echo "|---|---|---|---|---|---|---|---|"
for connections in $counts; do
  for entry in "${binaries[@]}"; do
    name=${entry%%=*} binary=${entry#*=}
    row "$name, default wait" "$connections" 0 "$binary"
    row "$name, wait off" "$connections" 0 "$binary" --wait-for-replicas 0
  done
done
if [[ $topology == server ]]; then
  for entry in "${binaries[@]}"; do
    name=${entry%%=*} binary=${entry#*=}
    row "$name, default wait, replica restarted at $((seconds / 3)) s" 32 1 "$binary"
  done
fi
