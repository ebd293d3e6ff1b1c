package lua

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// localsHeadroom is how many more locals the library's main chunk must
// have room for. Lua 5.1 (Redis's) refuses a function of more than 200
// active locals, and the library's main chunk holds every helper of
// lib.lua, window.lua, decide.lua, fair.lua, run.lua and multi.lua that the
// others call: merging three branches that each fit put it one over, and
// FUNCTION LOAD (then every decision) failed with "main function has more
// than 200 local variables" on a real Redis while miniredis's Lua, which
// has no such limit, passed. Each file keeps its own helpers inside a do
// block, declaring outside it only the names other files use.
const localsHeadroom = 30

// The library loads on a real Redis with room to spare: with
// localsHeadroom more locals at the top of its main chunk.
func TestLibraryLeavesRoomForMoreLocals(t *testing.T) {
	redistest.Require(t)
	rdb := redistest.Start(t).Client(t)
	src := Library()
	first, rest, ok := strings.Cut(src, "\n")
	require.True(t, ok && strings.HasPrefix(first, "#!lua name="), "the library starts with its shebang: %.60q", src)
	var pad strings.Builder
	for i := range localsHeadroom {
		fmt.Fprintf(&pad, "local headroom_%d = %d\n", i, i)
	}
	err := rdb.FunctionLoadReplace(t.Context(), first+"\n"+pad.String()+rest).Err()
	require.NoError(t, err, "the library with %d more locals in its main chunk", localsHeadroom)
}
