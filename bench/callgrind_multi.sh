#!/usr/bin/env bash
# callgrind_multi.sh counts the CPU instructions redis-server spends per call
# of a decision across two keys (issue 30: decide_multi) beside one of one
# key, under valgrind's callgrind, with the floors of each: an empty
# function with the same keys and ARGV, and one that reads TIME, HMGETs
# each key's hash and HSETs one field of it (the I/O a decision cannot
# avoid). Issue 30's target: a two-key decision at most 1.4x a one-key one,
# and a one-key decision no dearer than before (BASE=<commit> measures that
# commit's one-key function in the same server, for comparison).
#
#   bench/callgrind_multi.sh                 # needs valgrind, redis-server 7+, redis-cli, redis-benchmark, go
#   BASE=b5c2b1f PORT=7935 N=2000 bench/callgrind_multi.sh
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
port=${PORT:-7935}
n=${N:-2000}
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli redis-benchmark go; do
  command -v "$tool" >/dev/null || { echo "callgrind_multi.sh: $tool not on PATH" >&2; exit 2; }
done
if redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "callgrind_multi.sh: something already answers on port $port; set PORT" >&2
  exit 2
fi
work=$(mktemp -d)
vg=
cleanup() {
  [ -n "$vg" ] && kill "$vg" 2>/dev/null && wait "$vg" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$here" && go build -o "$work/luadump" ./bench/luadump)
"$work/luadump" -library >"$work/new.lua"
fn=$("$work/luadump" -name)
fm=${fn/decide_/decide_multi_}
fb=
if [ -n "${BASE:-}" ]; then
  mkdir "$work/base"
  (cd "$here" && git archive "$BASE" | tar -x -C "$work/base")
  (cd "$work/base" && go build -o "$work/luadump_base" ./bench/luadump)
  "$work/luadump_base" -library >"$work/base.lua"
  fb=$("$work/luadump_base" -name)
fi
cat >"$work/floors.lua" <<'EOL'
#!lua name=callgrind_multi_floors
redis.register_function('cgm_empty', function(KEYS, ARGV) return 1 end)
redis.register_function('cgm_io', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  for k = 1, #KEYS, 4 do
    redis.call('HMGET', KEYS[k], 'L', 'T', 's', 'O', 'V', 'M', 'D')
    redis.call('HSET', KEYS[k], 'T', string.format('%d 0 0 1000:%d', now, 1000))
  end
  return '1|0|999999||0|0|1'
end)
EOL

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/vg.log" 2>&1 &
vg=$!
for _ in $(seq 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
cli() { redis-cli -p "$port" "$@"; }
cli -x FUNCTION LOAD REPLACE <"$work/new.lua" >/dev/null
[ -n "$fb" ] && cli -x FUNCTION LOAD REPLACE <"$work/base.lua" >/dev/null
cli -x FUNCTION LOAD REPLACE <"$work/floors.lua" >/dev/null

# KEYS (internal/lua/decide.go): bucket, reservations, slots, configuration
# per key (decide_multi: then active tenants and start tags). ARGV: the options "granule horizon lapse lease headroom flags
# slot_expiry|defaults", then the task ID and cost (decide_multi always
# takes both; the one-key function takes none for a Take).
k1=(4 't:{a}:b' 't:{a}:r' 't:{a}:f' 't:{a}:c')
k2=(12 't:{a}:b' 't:{a}:r' 't:{a}:f' 't:{a}:c' 't:{a}:a' 't:{a}:t' 't:{b}:b' 't:{b}:r' 't:{b}:f' 't:{b}:c' 't:{b}:a' 't:{b}:t')
take='0 0 300000000 0 0 0 30000000|'
mw='1000000 60000000 300000000 0 20000 2 30000000|'
limits() {
  cli FLUSHALL >/dev/null
  cli HSET 't:{a}:b' L '1000000/1000/1000000 #1' >/dev/null
  cli HSET 't:{b}:b' L '1000000/1000/1000000 #1' >/dev/null
}
declare -A got
measure() {
  local name=$1
  shift
  limits
  redis-benchmark -p "$port" -n 200 -P 16 -c 1 -r 100000000 "$@" >/dev/null
  callgrind_control -z "$vg" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$n" -P 16 -c 1 -r 100000000 "$@" >/dev/null
  callgrind_control -d "$vg" >/dev/null 2>&1
  sleep 0.5
  local dump total cron
  dump=$(ls -t "$work"/cg.out.* | head -1)
  total=$(awk '/^summary:/{print $2; exit}' "$dump")
  cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
    awk '!found && index($0, ":serverCron [") { gsub(/,/, "", $1); v = $1; found = 1 } END { print found ? v : 0 }')
  got[$name]=$(((total - cron) / n))
  printf '  %-52s %8d\n' "$name" "${got[$name]}"
}
echo "instructions per call (no serverCron), $n pipelined calls, one bucket per key:"
[ -n "$fb" ] && measure "one key, Take, $BASE" FCALL "$fb" "${k1[@]}" "$take"
measure "one key, Take" FCALL "$fn" "${k1[@]}" "$take"
measure "two keys, Take" FCALL "$fm" "${k2[@]}" "$take" '' 1
[ -n "$fb" ] && measure "one key, middleware, $BASE" FCALL "$fb" "${k1[@]}" "$mw" 'id:__rand_int__' 1
measure "one key, middleware" FCALL "$fn" "${k1[@]}" "$mw" 'id:__rand_int__' 1
measure "two keys, middleware" FCALL "$fm" "${k2[@]}" "$mw" 'id:__rand_int__' 1
measure "floor: empty function, one key" FCALL cgm_empty "${k1[@]}" "$take"
measure "floor: empty function, two keys" FCALL cgm_empty "${k2[@]}" "$take" '' 1
measure "floor: TIME + HMGET + HSET, one key" FCALL cgm_io "${k1[@]}" "$take"
measure "floor: TIME + HMGET + HSET, two keys" FCALL cgm_io "${k2[@]}" "$take" '' 1
awk -v a="${got[two keys, Take]}" -v b="${got[one key, Take]}" 'BEGIN { printf "two keys / one key, Take: %.2fx (target <= 1.4x)\n", a / b }'
