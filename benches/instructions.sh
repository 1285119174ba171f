#!/usr/bin/env bash
# Instructions per request on each path, counted by callgrind: repeatable whatever else the
# machine is doing. Prints each path's count and its ratio to the bare service.
#
# usage: bash benches/instructions.sh [requests per path, default 20000]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
source benches/bench-binary.sh
bin=$(bench_binary allocations)
total() { # path count → total instructions
  valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
printf '%-12s %14s %10s\n' path instructions "x bare"
bare=""
for path in bare new floor reference replay reference_replay refuse_415 refuse_413 refuse_400 json_new json_replay; do
  base=$(total "$path" 0)
  all=$(total "$path" "$n")
  per=$(( (all - base) / n ))
  [[ -z "$bare" ]] && bare=$per
  printf '%-12s %14d %10s\n' "$path" "$per" "$(python3 -c "print(f'{$per/$bare:.2f}')")"
done
