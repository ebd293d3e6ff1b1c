// Command luadump writes the Lua this build of the library sends to Redis,
// for tools that measure the scripts outside the library
// (bench/callgrind.sh):
//
//	go run ./bench/luadump -library   # the source FUNCTION LOAD takes
//	go run ./bench/luadump -eval      # decide's source as EVAL takes it (lib.lua, window.lua, decide.lua)
//	go run ./bench/luadump -name      # decide's function name in the library
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/asynq-throttle/asynq-throttle/internal/lua"
)

func main() {
	library := flag.Bool("library", false, "write the function library's source")
	eval := flag.Bool("eval", false, "write the decide script's EVAL source")
	name := flag.Bool("name", false, "write the decide function's name")
	flag.Parse()
	switch {
	case *library:
		fmt.Print(lua.Library())
	case *eval:
		fmt.Print(lua.DecideScript.Source())
	case *name:
		fmt.Print(lua.DecideScript.Name())
	default:
		fmt.Fprintln(os.Stderr, "luadump: give one of -library, -eval, -name")
		os.Exit(2)
	}
}
