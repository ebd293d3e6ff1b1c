#!/usr/bin/env bash
# callgrind.sh counts the CPU instructions redis-server spends per call of
# our decide function and of go-redis/redis_rate's script, under valgrind's
# callgrind. Instruction counts repeat from run to run where wall-clock
# times on a shared machine do not; the instruction figures of
# bench/README.md come from here (issue 22's target: <= 85k for a Take with
# FCALL; issue 30's: a two-key decision <= 1.4x a one-key one).
#
#   bench/callgrind.sh            # needs valgrind, redis-server 7+, redis-cli, redis-benchmark, go
#   PORT=7811 N=2000 bench/callgrind.sh
#   TREE=/tmp/cgmain bench/callgrind.sh   # the Lua of another checkout (git worktree add /tmp/cgmain main)
#
# TREE (default: this script's checkout) is where bench/luadump is built
# from, so one copy of this script measures another build's Lua with the
# same calls: a build without decide_multi (before issue 30) skips the
# multi-key lines.
#
# valgrind is not part of a Redis or Go install: on Debian or Ubuntu,
# `sudo apt-get install valgrind` (it brings callgrind_control).
#
# What it measures, each over N pipelined calls (redis-benchmark -P 16, one
# connection) after 208 calls of warm-up, with the keys and ARGV the library
# sends (see internal/lua/decide.go for the contract):
#   - FCALL of the decide function of this build's library (FUNCTION LOAD of
#     the exact source the library loads, from bench/luadump): a Take on one
#     tier and on two, a middleware decision that is admitted (task ID,
#     headroom, pacing on), one that reserves a slot behind a queue, and an
#     enqueue-time booking (Limiter.Enqueue);
#   - FCALL of the multi-key function (decide_multi, issue 30; its name read
#     from the library), each beside its one-key base in the same run: a
#     Take on two keys of one tier each (Take(ctx, "c",
#     throttle.Key("d"))), the middleware's decision (task ID, headroom,
#     pacing) on two keys of two tiers each, and a decision on two keys that
#     reserves one instant and books it in both; the ratios two-key /
#     one-key are printed against issue 30's 1.4x;
#   - EVALSHA of the same decide script (lib.lua, window.lua, decide.lua; the fallback
#     for Redis 6.2, miniredis and ACLs without FUNCTION), Take and reserving;
#   - two floors: an empty function with the same keys and ARGV, and one that
#     reads TIME, HMGETs the hash and HSETs one field (the I/O a Take cannot
#     avoid), so what the decision's own Lua costs is the difference;
#   - redis_rate's allowN (EVALSHA, as redis_rate sends it).
#
# Under valgrind Redis runs some 50x slower, so memos kept per second of the
# Redis clock (the key's expiry) are refreshed on more calls than at full
# speed: the counts are a little high for our script.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
port=${PORT:-7811}
n=${N:-2000}
# redis-benchmark sends whole pipelines of 16: a count that is not a
# multiple of 16 runs up to 15 calls more than it counts (the figures come
# out high) and, under valgrind, can end with "All clients disconnected...
# aborting" (seen with N=1000). Round up.
n=$(((n + 15) / 16 * 16))
for tool in valgrind callgrind_control redis-server redis-cli redis-benchmark go; do
  if ! command -v "$tool" >/dev/null; then
    case $tool in
    valgrind | callgrind_control) echo "callgrind.sh: $tool not on PATH: install valgrind (Debian/Ubuntu: sudo apt-get install valgrind)" >&2 ;;
    *) echo "callgrind.sh: $tool not on PATH" >&2 ;;
    esac
    exit 2
  fi
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

# The Lua exactly as this build of the library sends it.
tree=${TREE:-$here}
(cd "$tree" && go build -o "$work/luadump" ./bench/luadump)
"$work/luadump" -library >"$work/library.lua"
"$work/luadump" -eval >"$work/decide.lua"
fn=$("$work/luadump" -name)
# decide_multi (issue 30): its name as the library registers it; none in a
# build before issue 30.
fn_multi=$(grep -o "register_function('asynq_throttle_decide_multi_[0-9a-f]*'" "$work/library.lua" | sed "s/^register_function('//; s/'\$//" || true)
rr_src=$(go env GOMODCACHE)/github.com/go-redis/redis_rate/v10@$(cd "$here" && go list -m -f '{{.Version}}' github.com/go-redis/redis_rate/v10)/lua.go
awk '/^var allowN = redis.NewScript\(`/{on=1; next} on && /^`\)/{exit} on' "$rr_src" >"$work/redis_rate.lua"
cat >"$work/floors.lua" <<'EOF'
#!lua name=callgrind_floors
redis.register_function('cg_empty', function(KEYS, ARGV) return 1 end)
redis.register_function('cg_io', function(KEYS, ARGV)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local h = redis.call('HMGET', KEYS[1], 'L', 'T', 's', 'O', 'V')
  redis.call('HSET', KEYS[1], 'T', string.format('%d 0 0 1000:%d', now, 1000))
  return '1|0|999999||0|0|1'
end)
EOF

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
  >"$work/valgrind.log" 2>&1 &
vg_pid=$!
for _ in $(seq 150); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.2
done
redis-cli -p "$port" ping >/dev/null || { echo "callgrind.sh: redis-server did not start" >&2; cat "$work/valgrind.log" >&2; exit 1; }

cli() { redis-cli -p "$port" "$@"; }
loadfn() {
  local out
  out=$(cli -x FUNCTION LOAD REPLACE <"$1")
  case $out in ERR* | *rror*) echo "callgrind.sh: FUNCTION LOAD $1: $out" >&2; exit 1 ;; esac
}
loadfn "$work/library.lua"
loadfn "$work/floors.lua"
sha_decide=$(cli -x SCRIPT LOAD <"$work/decide.lua")
sha_rr=$(cli -x SCRIPT LOAD <"$work/redis_rate.lua")

# KEYS (internal/lua/decide.go, Decide): bucket, reservations, slots in
# flight, configuration (keyspace.RedisKeys; the prefix is "throttle").
keys=(4 't:{c}:b' 't:{c}:r' 't:{c}:f' 't:{c}:c')
# ARGV (decide.go, FormatOptions): the options "granule_us horizon_us
# lapse_us lease headroom_us flags slot_expiry_us|defaults", then
# (task ID, cost) per caller; none for a lone caller without an ID, of cost 1.
# Limiter.Take: no granule, no reservation, no lease, exact bucket.
take=('0 0 300000000 0 0 0 30000000|')
# The middleware (ByProvider defaults): 1 s granule, 1 min horizon, 20 ms
# headroom, pacing on (flags 2), a task ID per call (redis-benchmark's -r);
# no lease asked (the decisions between two lease requests of a process).
mw=('1000000 60000000 300000000 0 20000 2 30000000|' 'id:__rand_int__' 1)
# Reserving behind a queue: as mw with a horizon that always holds the slot.
resv=('1000000 1000000000000 300000000 0 20000 2 30000000|' 'id:__rand_int__' 1)
# Limiter.Enqueue: as resv, booking (flags 1|2): every caller gets a slot.
book=('1000000 1000000000000 300000000 0 20000 3 30000000|' 'id:__rand_int__' 1)
# Fair shares (issue 23): as mw and resv with flag 8 and two more keys (the
# active tenants, their start tags), each caller a triple (task ID, cost,
# tenant).
fkeys=(6 't:{c}:b' 't:{c}:r' 't:{c}:f' 't:{c}:c' 't:{c}:a' 't:{c}:t')
fmw=('1000000 60000000 300000000 0 20000 10 30000000|' 'id:__rand_int__' 1 'acme')
fresv=('1000000 1000000000000 300000000 0 20000 10 30000000|' 'id:__rand_int__' 1 'acme')
# Several keys (issue 30, decide.go's DecideMulti): six KEYS per key as
# above (with the tenants' two), in the task's order, then ARGV the options
# (as one key's, lease always 0), the task ID ("" for Take) and the cost,
# always sent, and the tenant when the task has one (checked with MONITOR
# against Limiter.Take(ctx, "c", throttle.Key("d")) on Redis 7.0 before the
# tenants' keys: 8 KEYS, "0 0 300000000 0 0 0 30000000|", "", "1").
mkeys=(12 't:{c}:b' 't:{c}:r' 't:{c}:f' 't:{c}:c' 't:{c}:a' 't:{c}:t' 't:{d}:b' 't:{d}:r' 't:{d}:f' 't:{d}:c' 't:{d}:a' 't:{d}:t')
mtake=("${take[0]}" '' 1)
mmw=("${mw[@]}")
mresv=("${resv[@]}")

declare -A result dumpof nocron
# measure NAME COMMAND...: instructions per call over $n pipelined calls.
measure() {
  local name=$1
  shift
  echo "callgrind.sh: measuring $name" >&2
  redis-benchmark -p "$port" -n 208 -P 16 -c 1 -r 100000000 "$@" >/dev/null
  callgrind_control -z "$vg_pid" >/dev/null 2>&1
  redis-benchmark -p "$port" -n "$n" -P 16 -c 1 -r 100000000 "$@" >/dev/null
  callgrind_control -d "$vg_pid" >/dev/null 2>&1
  sleep 0.5
  local dump total
  dump=$(ls -t "$work"/cg.out.* | head -1)
  total=$(awk '/^summary:/{print $2; exit}' "$dump")
  result[$name]=$((total / n))
  dumpof[$name]=$dump
  # Redis's timer (serverCron, hz 10) runs per second of wall time, and
  # under valgrind on a busy machine a measurement lasts longer: its share
  # moves the total by a few thousand instructions per call from run to
  # run. Without it, the count repeats.
  local cron
  cron=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
    awk '!found && index($0, ":serverCron [") { gsub(/,/, "", $1); v = $1; found = 1 } END { print found ? v : 0 }')
  nocron[$name]=$(((total - cron) / n))
}

# parts NAME LABEL: where the instructions of one case go, per call, from
# callgrind_annotate's inclusive counts of Redis's (and libc's) functions.
parts() {
  local ann
  ann=$(callgrind_annotate --inclusive=yes --threshold=100 "${dumpof[$1]}" 2>/dev/null)
  inc() { # inc FUNC: the inclusive count of FUNC, per call
    awk -v f=":$1 [" -v n="$n" 'index($0, f) { gsub(/,/, "", $1); printf "%d", $1 / n; found=1; exit } END { if (!found) printf "0" }' <<<"$ann"
  }
  local total=${nocron[$1]} call pcall sc pr sd pf
  call=$(inc call) pcall=$(inc lua_pcall) sc=$(inc scriptCall) pr=$(inc parseReply) sd=$(inc strtod) pf=$(inc __printf_fp)
  echo "$2, by part (instructions per call, no cron):"
  printf '    %8d  outside the command: reading and parsing the request, writing the reply\n' $((total - call))
  printf '    %8d  FCALL itself: looking up the function, the KEYS and ARGV tables, Lua GC steps\n' $((call - pcall))
  printf '    %8d  the Lua of the decision, less what follows\n' $((pcall - sc - pr - sd - pf))
  printf '    %8d  number parsing (strtod: tonumber of ARGV and stored fields)\n' "$sd"
  printf '    %8d  float formatting (__printf_fp: string.format %%.17g)\n' "$pf"
  printf '    %8d  redis.call: the commands run (scriptCall)\n' "$sc"
  printf '    %8d  redis.call: their replies converted for Lua (parseReply)\n' "$pr"
}
# limits L [L2]: fresh keys with limits as SetLimits stores them (L in the
# bucket and the configuration): c with L, and d with L2 (default L).
limits() {
  cli FLUSHALL >/dev/null
  cli HSET 't:{c}:b' L "$1" >/dev/null
  cli HSET 't:{c}:c' L "$1" >/dev/null
  cli HSET 't:{d}:b' L "${2:-$1}" >/dev/null
  cli HSET 't:{d}:c' L "${2:-$1}" >/dev/null
}
# check COMMAND...: one call must answer like a decision, not an error.
check() {
  local out
  out=$(cli "$@" 2>&1)
  case $out in 0\|* | 1\|*) ;; *) echo "callgrind.sh: $* answered: $out" >&2; exit 1 ;; esac
}
# check_multi WANT COMMAND...: one decide_multi call must answer WANT, a
# glob of its reply ("0;1|*;1|*": both keys admitted).
check_multi() {
  local want=$1 out
  shift
  out=$(cli "$@" 2>&1)
  # shellcheck disable=SC2254
  case $out in $want) ;; *) echo "callgrind.sh: $* answered: $out (want $want)" >&2; exit 1 ;; esac
}

limits '1000000/1000/1000000 #1'
check FCALL "$fn" "${keys[@]}" "${take[@]}"
measure take1 FCALL "$fn" "${keys[@]}" "${take[@]}"
limits '1000000/1000/1000000 #1'
measure eval_take1 EVALSHA "$sha_decide" "${keys[@]}" "${take[@]}"
limits '1000000/1000/1000000 60000000/60000/60000000 #1'
measure take2 FCALL "$fn" "${keys[@]}" "${take[@]}"
limits '1000000/1000/1000000 #1'
measure mw FCALL "$fn" "${keys[@]}" "${mw[@]}"
limits '1/1000/1 #1'
check FCALL "$fn" "${keys[@]}" "${resv[@]}"
measure resv FCALL "$fn" "${keys[@]}" "${resv[@]}"
limits '1/1000/1 #1'
measure eval_resv EVALSHA "$sha_decide" "${keys[@]}" "${resv[@]}"
limits '100/1000/10 #1'
check FCALL "$fn" "${keys[@]}" "${book[@]}"
measure book FCALL "$fn" "${keys[@]}" "${book[@]}"
limits '1000000/1000/1000000 #1'
check FCALL "$fn" "${fkeys[@]}" "${fmw[@]}"
measure fmw FCALL "$fn" "${fkeys[@]}" "${fmw[@]}"
limits '1/1000/1 #1'
check FCALL "$fn" "${fkeys[@]}" "${fresv[@]}"
measure fresv FCALL "$fn" "${fkeys[@]}" "${fresv[@]}"
if [ -n "$fn_multi" ]; then
  # Each two-key case right after its one-key base, on the same limits.
  one='1000000/1000/1000000 #1'
  two='1000000/1000/1000000 60000000/60000/60000000 #1'
  limits "$one"
  check FCALL "$fn" "${keys[@]}" "${take[@]}"
  measure m_take1 FCALL "$fn" "${keys[@]}" "${take[@]}"
  limits "$one"
  check_multi '0;1|*;1|*' FCALL "$fn_multi" "${mkeys[@]}" "${mtake[@]}"
  measure m_take_k2 FCALL "$fn_multi" "${mkeys[@]}" "${mtake[@]}"
  check_multi '0;1|*;1|*' FCALL "$fn_multi" "${mkeys[@]}" "${mtake[@]}"
  limits "$two"
  check FCALL "$fn" "${keys[@]}" "${mw[@]}"
  measure m_mw1 FCALL "$fn" "${keys[@]}" "${mw[@]}"
  limits "$two"
  check_multi '0;1|*;1|*' FCALL "$fn_multi" "${mkeys[@]}" "${mmw[@]}"
  measure m_mw_k2 FCALL "$fn_multi" "${mkeys[@]}" "${mmw[@]}"
  check_multi '0;1|*;1|*' FCALL "$fn_multi" "${mkeys[@]}" "${mmw[@]}"
  # Reserving: 1/s burst 1 in both keys; every call reserves the instant
  # after the last one's, and books it in both (both keys' own first free
  # instant).
  limits '1/1000/1 #1'
  check FCALL "$fn" "${keys[@]}" "${resv[@]}"
  measure m_resv1 FCALL "$fn" "${keys[@]}" "${resv[@]}"
  limits '1/1000/1 #1'
  # (the first call takes the burst of both keys; the next ones reserve)
  check_multi '0;1|*;1|*' FCALL "$fn_multi" "${mkeys[@]}" "${mresv[@]}"
  check_multi '[12];0|*|tier:1|*;0|*' FCALL "$fn_multi" "${mkeys[@]}" "${mresv[@]}"
  measure m_resv_k2 FCALL "$fn_multi" "${mkeys[@]}" "${mresv[@]}"
  # (both keys hold every call's instant: their reservations count as
  # many; no call after the run is checked: the checks' own ID, reserved
  # before it, is due by then and admitted)
  rc=$(cli ZCARD 't:{c}:r') rd=$(cli ZCARD 't:{d}:r')
  if [ "$rc" != "$rd" ] || [ "$rc" -lt "$n" ]; then
    echo "callgrind.sh: two-key reserving: $rc reservations in c, $rd in d (want the same, >= $n)" >&2
    exit 1
  fi
fi
limits '1000000/1000/1000000 #1'
measure empty FCALL cg_empty "${keys[@]}" "${take[@]}"
measure io FCALL cg_io 4 'u:{c}:b' 'u:{c}:r' 'u:{c}:f' 'u:{c}:c' "${take[@]}"
cli FLUSHALL >/dev/null
measure rr EVALSHA "$sha_rr" 1 'rate:{c}' 1000000 1000000 1 1

rr=${result[rr]}
line() { # line NAME LABEL [TARGET]
  local v=${result[$1]} c=${nocron[$1]}
  printf '  %-70s %8d %7s %8d %7s' "$2" "$v" "$(awk -v a="$v" -v b="$rr" 'BEGIN{printf "%.2fx", a/b}')" \
    "$c" "$(awk -v a="$c" -v b="${nocron[rr]}" 'BEGIN{printf "%.2fx", a/b}')"
  if [ -n "${3:-}" ]; then
    printf '   target <= %dk: %s (all), %s (no cron)' $(($3 / 1000)) \
      "$([ "$v" -le "$3" ] && echo met || echo MISSED)" "$([ "$c" -le "$3" ] && echo met || echo MISSED)"
  fi
  printf '\n'
}
echo "redis-server $(redis-server --version | awk '{print $3}' | sed 's/^v=//') under callgrind, $n pipelined calls per line; decide = $fn"
echo "(all: every instruction of redis-server while the calls ran, the issue's measure; no cron: less Redis's timer, serverCron, which runs per second of wall time and so moves with the machine's load)"
printf '  %-70s %8s %7s %8s %7s\n' "call (instructions per call; /rr: against redis_rate's)" "all" "/rr" "no cron" "/rr"
line take1 "FCALL decide, Take, 1 tier (limit never binds)" 85000
line take2 "FCALL decide, Take, 2 tiers"
line mw "FCALL decide, middleware admitted (task ID, headroom, pacing)"
line resv "FCALL decide, middleware reserving a slot (1/s, a queue outstanding)"
line book "FCALL decide, Enqueue booking a slot (100/s burst 10, paced)"
line fmw "FCALL decide, as mw with a tenant (fair shares, one tenant)"
line fresv "FCALL decide, as resv with a tenant (fair shares, one tenant)"
line eval_take1 "EVALSHA decide, Take, 1 tier (the fallback without FUNCTION)"
line eval_resv "EVALSHA decide, reserving a slot (1/s)"
line empty "floor: FCALL of an empty function, same keys and ARGV"
line io "floor: FCALL of TIME + HMGET + HSET of one field, same keys and ARGV"
line rr "redis_rate's allowN, EVALSHA (1000000/s burst 1000000)"
t1=${nocron[take1]} e=${nocron[empty]} io=${nocron[io]}
echo "Take, 1 tier, by part (no cron): $e the call itself (empty function), $((io - e)) TIME + HMGET + HSET, $((t1 - io)) the decision's own Lua"
parts take1 "FCALL Take, 1 tier"
parts resv "FCALL reserving a slot"
echo "With a tenant against without (target <= 1.3x): admitted $(awk -v a="${nocron[fmw]}" -v b="${nocron[mw]}" 'BEGIN{printf "%.2fx %s", a/b, (a/b <= 1.3 ? "met" : "MISSED")}'), reserving $(awk -v a="${nocron[fresv]}" -v b="${nocron[resv]}" 'BEGIN{printf "%.2fx %s", a/b, (a/b <= 1.3 ? "met" : "MISSED")}') (no cron)"
if [ -n "$fn_multi" ]; then
  echo "Several keys (issue 30), decide_multi = $fn_multi; each two-key line beside its one-key base, measured one after the other:"
  printf '  %-70s %8s %7s %8s %7s\n' "call (instructions per call; /base: against the line above it)" "all" "/base" "no cron" "/base"
  pair() { # pair BASE NAME LABEL_BASE LABEL
    local b=${result[$1]} bc=${nocron[$1]} v=${result[$2]} c=${nocron[$2]}
    printf '  %-70s %8d %7s %8d %7s\n' "$3" "$b" "1.00x" "$bc" "1.00x"
    printf '  %-70s %8d %7s %8d %7s   target <= 1.4x: %s (all), %s (no cron)\n' "$4" "$v" \
      "$(awk -v a="$v" -v b="$b" 'BEGIN{printf "%.2fx", a/b}')" "$c" "$(awk -v a="$c" -v b="$bc" 'BEGIN{printf "%.2fx", a/b}')" \
      "$(awk -v a="$v" -v b="$b" 'BEGIN{print (a/b <= 1.4 ? "met" : "MISSED")}')" "$(awk -v a="$c" -v b="$bc" 'BEGIN{print (a/b <= 1.4 ? "met" : "MISSED")}')"
  }
  pair m_take1 m_take_k2 "FCALL decide, Take, 1 key of 1 tier" "FCALL decide_multi, Take, 2 keys of 1 tier each"
  pair m_mw1 m_mw_k2 "FCALL decide, middleware admitted, 1 key of 2 tiers" "FCALL decide_multi, middleware admitted, 2 keys of 2 tiers each"
  pair m_resv1 m_resv_k2 "FCALL decide, reserving a slot, 1 key (1/s)" "FCALL decide_multi, reserving one instant booked in 2 keys (1/s each)"
  parts m_take_k2 "FCALL decide_multi Take, 2 keys"
  parts m_resv_k2 "FCALL decide_multi reserving, 2 keys"
else
  echo "Several keys (issue 30): this build's library has no decide_multi; no multi-key lines"
fi
echo "EVALSHA against FCALL: Take $(awk -v a="${result[eval_take1]}" -v b="$t1" 'BEGIN{printf "+%d (%.2fx)", a-b, a/b}'), reserving $(awk -v a="${result[eval_resv]}" -v b="${result[resv]}" 'BEGIN{printf "+%d (%.2fx)", a-b, a/b}')"
