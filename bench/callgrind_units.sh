#!/usr/bin/env bash
# callgrind_units.sh measures issue 24's cost target, "a two-unit decision
# costs at most 1.2x the instructions of a one-unit decision measured in the
# same run", as callgrind.sh measures the others: the CPU instructions
# redis-server spends per FCALL of this build's decide function, under
# valgrind's callgrind, over N pipelined calls (redis-benchmark -P 16, one
# connection) after 200 calls of warm-up, all in one redis-server run.
#
#   bench/callgrind_units.sh      # needs valgrind, redis-server 7+, redis-cli, redis-benchmark, go
#   PORT=7812 N=2000 bench/callgrind_units.sh
#
# The keys and ARGV are what the library sends (checked against a
# Limiter's SetLimits and Take on Redis 7.0: SetLimits stores L as below,
# Take(ctx, key, Uses("tokens", 100)) sends its cost alone, "1,tokens=100":
# a lone caller without a task ID, lua.AppendCallers):
#   - one unit: a lone admitted Limiter.Take on a key with one bucket,
#     PerSecond(1000000) ('1000000/1000/1000000'), of cost 1 (no caller
#     pair: Take without options sends none);
#   - two units: a lone admitted Take(ctx, key, Uses("tokens", 100)) on a
#     key with a request bucket and a tokens bucket of the same period,
#     PerSecond(1000000) and PerSecond(1000000).In("tokens")
#     ('1000000/1000/1000000 1000000/1000/1000000~tokens');
#   - two units, a token count that differs call to call, as an LLM
#     task's estimate (prompt + max tokens) does: Uses("tokens", m) with m
#     from 7 to 99997 ("1,tokens=__rand_int__7": redis-benchmark -r 10000
#     writes 12 zero-padded digits, so m is 10 x a number below 10000 + 7,
#     never 0; leading zeros read as decimal, as the Lua reads any count),
#     on a key whose tokens bucket holds 1e9 (PerSecond(1000000).In("tokens")
#     with a burst of 1e9: the run's calls take at most 2.2e8 tokens, so
#     none is refused);
#   - for context: two request tiers of one unit (PerSecond(1000000),
#     PerMinute(60000000): what a second tier costs without a second
#     unit), and the middleware's admitted decision (task ID, 20 ms
#     headroom, pacing) on the one-unit key and on the two-unit key with
#     Uses("tokens", 100);
#   - the one-unit Take again at the end: how far a figure moves within
#     the run.
# No limit binds (the tokens bucket refills 1000000 a second; each call
# takes 100). "all" counts every instruction of redis-server while the
# calls ran (the issue's measure); "no cron" leaves out Redis's timer
# (serverCron), which runs per second of wall time and so moves with the
# machine's load (see callgrind.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
port=${PORT:-7812}
n=${N:-2000}
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli redis-benchmark go; do
  if ! command -v "$tool" >/dev/null; then
    case $tool in
    valgrind | callgrind_control | callgrind_annotate) echo "callgrind_units.sh: $tool not on PATH: install valgrind (Debian/Ubuntu: sudo apt-get install valgrind)" >&2 ;;
    *) echo "callgrind_units.sh: $tool not on PATH" >&2 ;;
    esac
    exit 2
  fi
done
if redis-cli -p "$port" ping >/dev/null 2>&1; then
  echo "callgrind_units.sh: something already answers on port $port; set PORT" >&2
  exit 2
fi

work=$(mktemp -d)
vg_pid=
cleanup() {
  [ -n "$vg_pid" ] && kill "$vg_pid" 2>/dev/null && wait "$vg_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

(cd "$here" && go build -o "$work/luadump" ./bench/luadump)
"$work/luadump" -library >"$work/library.lua"
fn=$("$work/luadump" -name)

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >"$work/valgrind.log" 2>&1 &
vg_pid=$!
for _ in $(seq 150); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.2
done
redis-cli -p "$port" ping >/dev/null || { echo "callgrind_units.sh: redis-server did not start" >&2; cat "$work/valgrind.log" >&2; exit 1; }

cli() { redis-cli -p "$port" "$@"; }
out=$(cli -x FUNCTION LOAD REPLACE <"$work/library.lua")
case $out in ERR* | *rror*) echo "callgrind_units.sh: FUNCTION LOAD: $out" >&2; exit 1 ;; esac

keys=(3 't:{c}:b' 't:{c}:r' 't:{c}:f')
# ARGV[1] (internal/lua/decide.go): "granule_us horizon_us lapse_us idle_ms
# lease headroom_us flags slot_expiry_us|defaults", then (task ID, cost)
# per caller; none for a lone caller without an ID, of cost 1, and the cost
# alone for one of another cost.
# Limiter.Take: no granule, no reservation, no lease, exact bucket.
take=('0 0 300000000 604800000 0 0 0 30000000|')
take_units=('0 0 300000000 604800000 0 0 0 30000000|' '1,tokens=100')
# The same Take with a different token count each call (see above).
take_units_vary=('0 0 300000000 604800000 0 0 0 30000000|' '1,tokens=__rand_int__7')
# The middleware (ByProvider defaults): 1 s granule, 1 min horizon, 20 ms
# headroom, pacing on (flags 2), a task ID per call (redis-benchmark's -r).
mw=('1000000 60000000 300000000 604800000 0 20000 2 30000000|' 'id:__rand_int__' 1)
mw_units=('1000000 60000000 300000000 604800000 0 20000 2 30000000|' 'id:__rand_int__' '1,tokens=100')
one='1000000/1000/1000000 #1'
two_units='1000000/1000/1000000 1000000/1000/1000000~tokens #1'
two_tiers='1000000/1000/1000000 60000000/60000/60000000 #1'
two_units_big='1000000/1000/1000000 1000000/1000/1000000000~tokens #1'

declare -A result nocron dumpof
# measure NAME COMMAND...: instructions per call over $n pipelined calls.
# range: redis-benchmark's -r, the numbers __rand_int__ draws from.
range=100000000
measure() {
  local name=$1
  shift
  redis-benchmark -p "$port" -n 200 -P 16 -c 1 -r "$range" "$@" >/dev/null
  callgrind_control -z "$vg_pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$n" -P 16 -c 1 -r "$range" "$@" >/dev/null
  callgrind_control -d "$vg_pid" >/dev/null 2>&1
  sleep 0.5
  local dump total cron
  dump=$(ls -t "$work"/cg.out.* | head -1)
  total=$(awk '/^summary:/{print $2; exit}' "$dump")
  cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
    awk '!found && index($0, ":serverCron [") { gsub(/,/, "", $1); v = $1; found = 1 } END { print found ? v : 0 }')
  result[$name]=$((total / n))
  nocron[$name]=$(((total - cron) / n))
  dumpof[$name]=$dump
}
# parts NAME: where one case's instructions go, per call, from
# callgrind_annotate's inclusive counts (as callgrind.sh's parts).
parts() {
  local ann
  ann=$(callgrind_annotate --inclusive=yes --threshold=100 "${dumpof[$1]}" 2>/dev/null)
  inc() {
    awk -v f=":$1 [" -v n="$n" 'index($0, f) { gsub(/,/, "", $1); printf "%d", $1 / n; found=1; exit } END { if (!found) printf "0" }' <<<"$ann"
  }
  local total=${nocron[$1]} call pcall sc pr sd pf
  call=$(inc call) pcall=$(inc lua_pcall) sc=$(inc scriptCall) pr=$(inc parseReply) sd=$(inc strtod) pf=$(inc __printf_fp)
  printf '  %-22s %8d %8d %8d %8d %8d %8d %8d\n' "$1" $((total - call)) $((call - pcall)) $((pcall - sc - pr - sd - pf)) "$sd" "$pf" "$sc" "$pr"
}
# limits L: a fresh key with limits L (as SetLimits stores them).
limits() { cli FLUSHALL >/dev/null; cli HSET 't:{c}:b' L "$1" >/dev/null; }
# admitted COMMAND...: the call must be admitted ("1|...").
admitted() {
  local out
  out=$(cli "$@" 2>&1)
  case $out in 1\|*) ;; *) echo "callgrind_units.sh: $* answered: $out (want admitted, 1|...)" >&2; exit 1 ;; esac
}
run() { # run NAME LIMITS ARGS...: a fresh key, checked before and after
  local name=$1 lim=$2
  shift 2
  limits "$lim"
  admitted FCALL "$fn" "${keys[@]}" "$@"
  measure "$name" FCALL "$fn" "${keys[@]}" "$@"
  admitted FCALL "$fn" "${keys[@]}" "$@"
}

run take1 "$one" "${take[@]}"
run take_units "$two_units" "${take_units[@]}"
# (checked with a count of its own: __rand_int__ is drawn only by redis-benchmark)
limits "$two_units_big"
admitted FCALL "$fn" "${keys[@]}" "${take_units[0]}" '1,tokens=17'
range=10000
measure take_units_vary FCALL "$fn" "${keys[@]}" "${take_units_vary[@]}"
range=100000000
admitted FCALL "$fn" "${keys[@]}" "${take_units[0]}" '1,tokens=17'
run take2 "$two_tiers" "${take[@]}"
run mw1 "$one" "${mw[@]}"
run mw_units "$two_units" "${mw_units[@]}"
run take1_again "$one" "${take[@]}"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2fx", a/b}'; }
line() { # line NAME LABEL BASE
  printf '  %-78s %8d %8d   %6s %6s\n' "$2" "${result[$1]}" "${nocron[$1]}" \
    "$(ratio "${result[$1]}" "${result[$3]}")" "$(ratio "${nocron[$1]}" "${nocron[$3]}")"
}
echo "redis-server $(redis-server --version | awk '{print $3}' | sed 's/^v=//') under callgrind, $n pipelined calls per line, all in one run; decide = $fn"
printf '  %-78s %8s %8s   %6s %6s\n' "FCALL decide (instructions per call; ratios against the line's base)" "all" "no cron" "/base" "/base"
line take1 "Take, one unit: 1 bucket, cost 1 (base of the next four)" take1
line take_units "Take, two units: request + tokens buckets (1s), Uses(\"tokens\", 100)" take1
line take_units_vary "Take, two units, Uses(\"tokens\", m), m different each call (7-99997)" take1
line take2 "Take, one unit, two tiers (1s, 1m): for context" take1
line take1_again "Take, one unit, again at the end of the run" take1
line mw1 "middleware admitted, one unit: 1 bucket (base of the next)" mw1
line mw_units "middleware admitted, two units, Uses(\"tokens\", 100)" mw1
# verdict NAME: NAME against the one-unit Take, all and no cron, met or not.
verdict() {
  local r_all r_nc
  r_all=$(awk -v a="${result[$1]}" -v b="${result[take1]}" 'BEGIN{print a/b}')
  r_nc=$(awk -v a="${nocron[$1]}" -v b="${nocron[take1]}" 'BEGIN{print a/b}')
  printf '%s %s (all), %s %s (no cron)' "$(ratio "${result[$1]}" "${result[take1]}")" \
    "$(awk -v r="$r_all" 'BEGIN{print (r <= 1.2 ? "met" : "MISSED")}')" \
    "$(ratio "${nocron[$1]}" "${nocron[take1]}")" "$(awk -v r="$r_nc" 'BEGIN{print (r <= 1.2 ? "met" : "MISSED")}')"
}
echo "By part (instructions per call, no cron): outside the command (request, reply) | FCALL itself (lookup, KEYS/ARGV, GC) | the decision's Lua less the next four | strtod | __printf_fp | redis.call commands (scriptCall) | their replies for Lua (parseReply)"
printf '  %-22s %8s %8s %8s %8s %8s %8s %8s\n' case outside fcall lua strtod printf calls replies
parts take1
parts take_units
parts take_units_vary
parts take2
echo "Two-unit Take against one-unit Take (issue 24: <= 1.2x): constant cost $(verdict take_units); varying cost $(verdict take_units_vary); middleware admitted: $(ratio "${result[mw_units]}" "${result[mw1]}") (all), $(ratio "${nocron[mw_units]}" "${nocron[mw1]}") (no cron)"
