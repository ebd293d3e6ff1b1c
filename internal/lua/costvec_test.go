package lua

import (
	"context"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// costVecCheck runs after lib.lua in one EVAL. For each limits string it
// reads every cost argument (ARGV) with the key's spec, whose one-unit
// pattern (upat1) and kept vectors (costs) are used, and with a copy
// without either, which reads by the general rules; it returns every
// argument on which they differ, and what each read.
const costVecCheck = `
local out = {}
local function show(c)
  if type(c) ~= 'table' then return tostring(c) end
  local s = {}
  for i = 1, #c do s[i] = string.format('%.17g', c[i]) end
  return '{' .. table.concat(s, ',') .. '}'
end
for _, lim in ipairs({'10/1000/10 100/1000/100~tokens', '100/1000/100~tokens 10/1000/10',
    '10/1000/10 100/1000/100~in-tokens 6000/60000/6000~in-tokens', '10/1000/10 100/1000/100~tokens 5/1000/5~images',
    '10/1000/10 20/60000/20'}) do
  local spec = assert(parse_limits(lim))
  local plain = {}
  for k, v in pairs(spec) do plain[k] = v end
  plain.upat1, plain.costs = nil, nil
  local into = {}
  for round = 1, 3 do -- (read, kept, kept)
    for i = 1, #ARGV do
      local raw = ARGV[i]
      local want = show(cost_vec(raw, plain))
      local got = show(cost_vec(raw, spec))
      local missed = show(cost_miss(raw, spec, into))
      if got ~= want or missed ~= want then
        out[#out + 1] = lim .. ' ' .. raw .. ': ' .. got .. ' and ' .. missed .. ', want ' .. want
      end
    end
  end
end
return out
`

// costArgs are cost arguments of every shape cost_vec reads: what
// decide.go writes, and what it never writes (leading zeros, counts out of
// range, other units, repeated units, not numbers).
var costArgs = []string{
	"1", "2", "1,tokens=100", "3,tokens=7", "1,tokens=0", "0,tokens=5", "1,tokens=0000000012347",
	"0001,tokens=5", "1000000000,tokens=1000000000", "1000000001,tokens=5", "1,tokens=1000000001",
	"1,tokens=" + fmt.Sprint(uint64(1)<<63), "1,in-tokens=40", "1,tokens=5,images=2", "1,images=2,tokens=5",
	"1,tokens=5,tokens=7", "1,tokens=5x", "1,tokens=", "1,tokens=-5", "1,tokens=1e3", "1,tokens= 5",
	"1,tokens=0x10", " 1,tokens=5", "1.5,tokens=5", "1e2,tokens=5", "x,tokens=5", ",tokens=5",
	"1,Tokens=5", "1,xtokens=5", "2,,tokens=5", "1,tokens=5,", "", "1,", "abc", "1,tokens=5=6",
	"00,tokens=3", "1,tokens=99999999999999999999999999", "9999999999999999999999,tokens=3",
}

func runCostVecCheck(t *testing.T, rdb *redis.Client) {
	t.Helper()
	args := make([]any, len(costArgs))
	for i, a := range costArgs {
		args[i] = a
	}
	v, err := rdb.Eval(context.Background(), libSrc+"\n"+costVecCheck, nil, args...).StringSlice()
	require.NoError(t, err)
	assert.Empty(t, v, "cost vectors read with the one-unit pattern or kept differ from the general rules")
}

// The one-unit pattern (upat1) and the kept vectors read every cost
// argument as the general rules do, in miniredis's Lua and in Redis's.
func TestCostVecOneUnitPatternReadsAsTheGeneralRules(t *testing.T) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		runCostVecCheck(t, rdb)
	})
	t.Run("redis", func(t *testing.T) {
		redistest.Require(t)
		runCostVecCheck(t, redistest.Start(t).Client(t))
	})
}

// costKeepCheck runs after lib.lua: it fills a key's kept vectors with
// costs that differ, then says which of the cost arguments in ARGV are kept
// after cost_vec read each twice in a row, or once after COSTS_RENEW other
// misses.
const costKeepCheck = `
local spec = assert(parse_limits('10/1000/10 100/1000/100~tokens'))
local costs, out = spec.costs, {}
local into = {}
for i = 1, COSTS + 10 do cost_miss('1,tokens=' .. i, spec, into) end
if costs[0] ~= COSTS then out[#out + 1] = 'kept ' .. costs[0] .. ' of ' .. (COSTS + 10) .. ' different costs' end
if costs['1,tokens=' .. (COSTS + 5)] then out[#out + 1] = 'a cost was kept once full' end
-- a cost said twice in a row is kept
cost_vec(ARGV[1], spec)
cost_vec(ARGV[1], spec)
if not costs[ARGV[1]] then out[#out + 1] = 'a cost said twice in a row was not kept' end
if costs[0] ~= 1 then out[#out + 1] = 'kept ' .. costs[0] .. ' after renewing, want 1' end
-- once full again, a cost said once is kept at the COSTS_RENEW-th miss
for i = 1, COSTS - 1 do cost_vec('2,tokens=' .. i, spec) end
if costs[0] ~= COSTS then out[#out + 1] = 'kept ' .. costs[0] .. ', want ' .. COSTS end
for i = 1, COSTS_RENEW - 2 do cost_miss('3,tokens=' .. i, spec, into) end
cost_vec(ARGV[2], spec)
if costs[ARGV[2]] then out[#out + 1] = 'kept before COSTS_RENEW misses' end
cost_vec(ARGV[3], spec)
if not costs[ARGV[3]] then out[#out + 1] = 'not kept after COSTS_RENEW misses' end
-- what was read into the caller's table is never a kept vector
for k, c in pairs(costs) do
  if c == into then out[#out + 1] = 'the caller\'s table was kept' end
end
return out
`

// Once the kept vectors are full, costs that differ are read without
// keeping them; a cost said twice in a row, or after COSTS_RENEW misses,
// renews them.
func TestCostVecKeepsCostsSaidAgain(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	v, err := rdb.Eval(context.Background(), libSrc+"\n"+costKeepCheck, nil, "1,tokens=500", "1,tokens=600", "1,tokens=700").StringSlice()
	require.NoError(t, err)
	assert.Empty(t, v)
}
