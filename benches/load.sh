#!/usr/bin/env bash
# End-to-end load over loopback: the same create handler served bare and behind the layer
# (memory store), under wrk, on distinct keys (every request new) and on one key (every request
# after the first a replay). Prints requests/s and p50/p99 latency side by side, and the ratio
# of layered to bare measured in the same run.
#
# The machine is noisy, so the two servers are measured in alternation, round after round, and
# the medians are reported: the ratio column is the median of each round's ratio. Beside it,
# the server's own CPU time a request (user and system, from /proc, over the run), and the
# ratio of the two: what the layer costs the server whatever the load generator and the
# scheduler did in that round, where the requests/s ratio moves with both. Where
# `taskset` is available, the servers run on the last core and wrk on the first, so that the
# two do not trade places between runs.
#
# usage: bash benches/load.sh [seconds per run, default 10] [connections, default 32] [rounds, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
connections=${2:-32}
rounds=${3:-3}
last_core=$(($(nproc) - 1))
pin() { # core command… : becomes the command, on that core when it can be pinned
  # `exec`: called in the background or in a pipeline (a subshell either way), the subshell
  # becomes the command, so that `$!` is the server's own pid and the exit trap stops it.
  local core=$1; shift
  if command -v taskset >/dev/null && ((last_core > 0)); then exec taskset -c "$core" "$@"; else exec "$@"; fi
}
command -v wrk >/dev/null || { echo "wrk is needed: apt-get install -y wrk"; exit 1; }

source benches/bench-binary.sh
bin=$(bench_binary e2e_server)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$work"' EXIT

cat >"$work/distinct.lua" <<'LUA'
local prefix = tostring(os.time()) .. tostring(math.random(1000000))
local counter = 0
request = function()
  counter = counter + 1
  local key = "k-" .. prefix .. "-" .. counter
  local body = '{"request_id":"' .. key .. '","parcel_id":"parcel-42"}'
  return wrk.format("POST", "/labels", {["Content-Type"] = "application/json", ["Idempotency-Key"] = key}, body)
end
LUA
cat >"$work/replay.lua" <<'LUA'
wrk.method = "POST"
wrk.path = "/labels"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "label-req-7"
wrk.body = '{"request_id":"label-req-7","parcel_id":"parcel-42"}'
LUA

start() { # mode port
  pin "$last_core" "$bin" "$1" "127.0.0.1:$2" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$2/" && return; sleep 0.05; done
  echo "the $1 server did not start"; exit 1
}
cpu_ticks() { # pid → the user and system clock ticks it has used
  awk '{print $14 + $15}' "/proc/$1/stat"
}
run() { # port script pid → "rps p50 p99 errors requests cpu-µs-a-request"
  local before after
  before=$(cpu_ticks "$3")
  local out
  out=$(run_wrk "$1" "$2")
  after=$(cpu_ticks "$3")
  read -r _ _ _ _ requests <<<"$out"
  echo "$out $(python3 -c "print(f'{($after - $before) * 1e6 / $(getconf CLK_TCK) / max($requests, 1):.2f}')")"
}
run_wrk() { # port script → "rps p50 p99 errors requests"
  pin 0 wrk -t1 -c"$connections" -d"${seconds}s" --latency -s "$work/$2.lua" "http://127.0.0.1:$1" \
    | python3 -c 'import re,sys
text = sys.stdin.read()
def ms(v):
    n, u = re.match(r"([\d.]+)(\w+)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1, "s": 1000}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p50 = ms(re.search(r"^\s*50%\s+(\S+)", text, re.M).group(1))
p99 = ms(re.search(r"^\s*99%\s+(\S+)", text, re.M).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
requests = re.search(r"(\d+) requests in", text).group(1)
print(f"{rps:.0f} {p50:.3f} {p99:.3f} {errors.group(1) if errors else 0} {requests}")'
}

bare=$(free_port)
layered=$(free_port)
retained=$(free_port)
floor=$(free_port)
start bare "$bare"
start layered "$layered"
start retained "$retained"
start floor "$floor"
resident() { # pid → resident bytes
  echo $(( $(awk '{print $2}' "/proc/$1/statm") * $(getconf PAGESIZE) ))
}
declare -A pid_of=([$bare]=${pids[0]} [$layered]=${pids[1]} [$retained]=${pids[2]} [$floor]=${pids[3]})
layered_pid=${pids[1]}
layered_before=$(resident "$layered_pid")
layered_keys=0
median() { python3 -c 'import statistics,sys; print(statistics.median(float(v) for v in sys.argv[1:]))' "$@"; }
printf '| keys | bare req/s | layered req/s | ratio (median of %s rounds) | bare p50 / p99 ms | layered p50 / p99 ms | server CPU a request, bare / layered µs | CPU ratio, bare ÷ layered (median) |\n' "$rounds"
printf '|---|---|---|---|---|---|---|---|\n'
# The layered server keeps every key; the retained one keeps completed keys for one second, as
# a deployment keeps them for its retry window rather than for ever; the floor is the layer on a
# store that keeps nothing: what the layer's own steps cost, whatever the store.
for row in distinct:layered distinct:retained distinct:floor replay:layered; do
  scenario=${row%%:*} name=${row##*:} server=${!name}
  b_rps=() l_rps=() ratios=() b_p50=() b_p99=() l_p50=() l_p99=() b_cpu=() l_cpu=() cpu_ratios=()
  for ((round = 0; round < rounds; round++)); do
    read -r rps p50 p99 _ _ cpu <<<"$(run "$bare" "$scenario" "${pid_of[$bare]}")"
    b_rps+=("$rps") b_p50+=("$p50") b_p99+=("$p99") b_cpu+=("$cpu")
    read -r rps p50 p99 errors requests cpu <<<"$(run "$server" "$scenario" "${pid_of[$server]}")"
    [[ "$row" == distinct:layered ]] && layered_keys=$((layered_keys + requests))
    l_rps+=("$rps") l_p50+=("$p50") l_p99+=("$p99") l_cpu+=("$cpu")
    ratios+=("$(python3 -c "print($rps / ${b_rps[-1]})")")
    cpu_ratios+=("$(python3 -c "print(${b_cpu[-1]} / max($cpu, 1e-9))")")
    [[ "$errors" == 0 ]] || echo "note: $errors layered responses were not 2xx"
  done
  printf '| %s | %.0f | %.0f | %.2f (%s) | %.3f / %.3f | %.3f / %.3f | %.2f / %.2f | %.2f (%s) |\n' "$scenario, ${row##*:}" \
    "$(median "${b_rps[@]}")" "$(median "${l_rps[@]}")" "$(median "${ratios[@]}")" \
    "$(printf '%.2f ' "${ratios[@]}" | sed 's/ $//')" \
    "$(median "${b_p50[@]}")" "$(median "${b_p99[@]}")" \
    "$(median "${l_p50[@]}")" "$(median "${l_p99[@]}")" \
    "$(median "${b_cpu[@]}")" "$(median "${l_cpu[@]}")" \
    "$(median "${cpu_ratios[@]}")" "$(printf '%.2f ' "${cpu_ratios[@]}" | sed 's/ $//')"
done
# Resident memory per completed key under load: the server that keeps every key, its growth
# over the distinct runs divided by the keys they made (the lesson's response included).
layered_after=$(resident "$layered_pid")
python3 -c "print(f'resident memory per completed key under load (keeping every key): {($layered_after - $layered_before) / $layered_keys:.0f} bytes over $layered_keys keys')"
