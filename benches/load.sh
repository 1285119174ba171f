#!/usr/bin/env bash
# End-to-end load over loopback: the same create handler served bare and behind the layer
# (memory store), under wrk, on distinct keys (every request new) and on one key (every request
# after the first a replay). Prints requests/s and p50/p99 latency side by side, and the ratio
# of layered to bare measured in the same run.
#
# usage: bash benches/load.sh [seconds per run, default 10] [connections, default 32]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
connections=${2:-32}
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
  "$bin" "$1" "127.0.0.1:$2" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do curl -s -o /dev/null "127.0.0.1:$2/" && return; sleep 0.05; done
  echo "the $1 server did not start"; exit 1
}
run() { # port script → "rps p50 p99"
  wrk -t1 -c"$connections" -d"${seconds}s" --latency -s "$work/$2.lua" "http://127.0.0.1:$1" \
    | python3 -c 'import re,sys
text = sys.stdin.read()
def ms(v):
    n, u = re.match(r"([\d.]+)(\w+)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1, "s": 1000}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
p50 = ms(re.search(r"50%\s+(\S+)", text).group(1))
p99 = ms(re.search(r"99%\s+(\S+)", text).group(1))
errors = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
print(f"{rps:.0f} {p50:.3f} {p99:.3f} {errors.group(1) if errors else 0}")'
}

bare=$(free_port)
layered=$(free_port)
start bare "$bare"
start layered "$layered"
printf '| keys | bare req/s | layered req/s | ratio | bare p50 / p99 ms | layered p50 / p99 ms |\n'
printf '|---|---|---|---|---|---|\n'
for scenario in distinct replay; do
  read -r b_rps b_p50 b_p99 _ <<<"$(run "$bare" "$scenario")"
  read -r l_rps l_p50 l_p99 l_err <<<"$(run "$layered" "$scenario")"
  ratio=$(python3 -c "print(f'{$l_rps/$b_rps:.2f}')")
  printf '| %s | %s | %s | %s | %s / %s | %s / %s |\n' \
    "$scenario" "$b_rps" "$l_rps" "$ratio" "$b_p50" "$b_p99" "$l_p50" "$l_p99"
  [[ "$l_err" == 0 ]] || echo "note: $l_err layered responses were not 2xx"
done
