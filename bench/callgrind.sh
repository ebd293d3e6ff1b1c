#!/usr/bin/env bash
# callgrind.sh counts the CPU instructions redis-server spends per call of our
# decide script and of go-redis/redis_rate's script, under valgrind's
# callgrind. Instruction counts repeat from run to run where wall-clock
# times on a shared machine do not; the README's instruction figures come
# from here.
#
#   bench/callgrind.sh            # needs valgrind, redis-server, redis-cli, redis-benchmark, go
#   PORT=7811 N=2000 bench/callgrind.sh
#
# Under valgrind Redis runs some 50x slower, so memos that are kept per
# second of the Redis clock (the state key's expiry) are refreshed on more
# calls than at full speed: the counts are a little high for our script.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
port=${PORT:-7811}
n=${N:-2000}
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark go; do
  command -v "$tool" >/dev/null || { echo "callgrind.sh: $tool not on PATH" >&2; exit 2; }
done
if redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "callgrind.sh: something already answers on port $port; set PORT" >&2
  exit 2
fi

work=$(mktemp -d)
vg_pid=
cleanup() {
  [ -n "$vg_pid" ] && kill "$vg_pid" 2>/dev/null && wait "$vg_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >"$work/valgrind.log" 2>&1 &
vg_pid=$!
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.2
done
redis-cli -p "$port" ping >/dev/null || { echo "callgrind.sh: redis-server did not start" >&2; cat "$work/valgrind.log" >&2; exit 1; }

# The scripts, exactly as the library and redis_rate send them.
cat "$here/lua/lib.lua" "$here/lua/decide.lua" >"$work/decide.lua"
printf 'return 1' >"$work/empty.lua"
{ cat "$here/lua/lib.lua"; printf '\nreturn 1'; } >"$work/helpers.lua"
rr_src=$(go env GOMODCACHE)/github.com/go-redis/redis_rate/v10@$(cd "$here" && go list -m -f '{{.Version}}' github.com/go-redis/redis_rate/v10)/lua.go
awk '/^var allowN = redis.NewScript\(`/{on=1; next} on && /^`\)/{exit} on' "$rr_src" >"$work/redis_rate.lua"

load() { redis-cli -p "$port" SCRIPT LOAD "$(cat "$1")"; }
sha_decide=$(load "$work/decide.lua")
sha_empty=$(load "$work/empty.lua")
sha_helpers=$(load "$work/helpers.lua")
sha_rr=$(load "$work/redis_rate.lua")

keys=(4 't:{c}:cfg' 't:{c}:state' 't:{c}:suspend' 't:{c}:resv')
# ARGV of a Take: one decision, no reservation, default lapse and idle expiry.
take_args=(1 0 0 300000000 604800000 0 0 '')
# ARGV of a middleware decision that reserves: 1 s granule, a horizon that
# always holds the slot, a task ID per call (redis-benchmark's -r).
resv_args=(1 1000000 1000000000000 300000000 604800000 0 0 'id:__rand_int__')

# measure NAME SHA ARGS...: instructions per call over $n pipelined calls.
measure() {
  local name=$1 sha=$2
  shift 2
  redis-benchmark -p "$port" -n 200 -P 16 -c 1 -r 100000000 EVALSHA "$sha" "$@" >/dev/null
  callgrind_control -z "$vg_pid" >/dev/null
  redis-benchmark -p "$port" -n "$n" -P 16 -c 1 -r 100000000 EVALSHA "$sha" "$@" >/dev/null
  callgrind_control -d "$vg_pid" >/dev/null
  sleep 0.5
  local dump total
  dump=$(ls -t "$work"/cg.out.* | head -1)
  total=$(awk '/^summary:/{print $2; exit}' "$dump")
  printf '  %-58s %8d instructions/call\n' "$name" $((total / n))
}

limits() { redis-cli -p "$port" FLUSHALL >/dev/null; redis-cli -p "$port" HSET 't:{c}:cfg' tiers 1 rate:1 "$1" per_ms:1 1000 burst:1 "$2" >/dev/null; }

echo "redis-server $(redis-server --version | awk '{print $3}') under callgrind, $n calls per line"
limits 1000000 1000000
measure "decide.lua, Take (limit never binds)" "$sha_decide" "${keys[@]}" "${take_args[@]}"
limits 1 1
measure "decide.lua, reserving a slot (1/s, a queue outstanding)" "$sha_decide" "${keys[@]}" "${resv_args[@]}"
measure "an empty script with the same 4 keys and 8 arguments" "$sha_empty" "${keys[@]}" "${take_args[@]}"
measure "lib.lua's helpers alone, same keys and arguments" "$sha_helpers" "${keys[@]}" "${take_args[@]}"
redis-cli -p "$port" FLUSHALL >/dev/null
measure "redis_rate's allowN (1000000/s burst 1000000)" "$sha_rr" 1 'rate:{c}' 1000000 1000000 1 1
