package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// exampleRedis starts an in-memory Redis whose clock stands still at a fixed
// instant, so that the examples print the same every time. Real code passes
// its own *redis.Client (or cluster client) to NewLimiter.
func exampleRedis() (*miniredis.Miniredis, *redis.Client) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	mr.SetTime(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	return mr, redis.NewClient(&redis.Options{Addr: mr.Addr()})
}

func ExampleLimiter_Take() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerSecond(2)); err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < 3; i++ {
		d, err := lim.Take(ctx, "slack")
		if err != nil {
			fmt.Println(err)
			return
		}
		if d.Allowed {
			fmt.Printf("call %d: allowed, %d left\n", i+1, d.Remaining)
		} else {
			fmt.Printf("call %d: refused by tier %d, retry after %v\n", i+1, d.Tier, d.RetryAfter)
		}
	}
	// Output:
	// call 1: allowed, 1 left
	// call 2: allowed, 0 left
	// call 3: refused by tier 1, retry after 500ms
}

func ExampleLimiter_SetLimits() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	// Bursts of up to 3, one per second on average, and 5 per minute at
	// most: a call needs a token from both.
	err := lim.SetLimits(ctx, "github", throttle.PerSecond(1).WithBurst(3), throttle.PerMinute(5))
	if err != nil {
		fmt.Println(err)
		return
	}
	limits, _ := throttle.Limits(lim, ctx, "github")
	fmt.Println(limits)

	for i := 0; i < 4; i++ {
		d, _ := lim.Take(ctx, "github")
		fmt.Println(d.Allowed, d.Reason, d.RetryAfter)
	}
	mr.SetTime(time.Date(2025, 1, 1, 12, 0, 3, 0, time.UTC)) // 3 s later
	for i := 0; i < 3; i++ {
		d, _ := lim.Take(ctx, "github")
		fmt.Println(d.Allowed, d.Reason, d.Tier, d.RetryAfter)
	}

	err = lim.SetLimits(ctx, "github", throttle.PerSecond(0))
	fmt.Println(errors.Is(err, throttle.ErrInvalidLimit))
	// Output:
	// [1/1s burst 3 5/1m0s burst 5]
	// true allowed 0s
	// true allowed 0s
	// true allowed 0s
	// false tier 1s
	// true allowed 0 0s
	// true allowed 0 0s
	// false tier 2 9s
	// true
}

func ExampleLimiter_Suspend() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb, throttle.WithDefaultLimits(throttle.PerSecond(10)))
	// The provider answered 429 with Retry-After: 30.
	if err := lim.Suspend(ctx, "stripe", 30*time.Second); err != nil {
		fmt.Println(err)
		return
	}
	d, _ := lim.Take(ctx, "stripe")
	fmt.Println(d.Allowed, d.Reason, d.RetryAfter)

	_, _ = lim.Resume(ctx, "stripe")
	d, _ = lim.Take(ctx, "stripe")
	fmt.Println(d.Allowed)
	// Output:
	// false suspended 30s
	// true
}

func ExampleNewTask() {
	task, err := throttle.NewTask("slack:sync", []byte(`{"channel":"general"}`), throttle.Key("slack"))
	fmt.Println(task.Type(), task.Headers()[throttle.HeaderKey], err)
	_, err = throttle.NewTask("slack:sync", nil, throttle.Key("slack"), throttle.Cost(0))
	fmt.Println(err)
	// Output:
	// slack:sync slack <nil>
	// throttle: NewTask("slack:sync"): throttle.Cost(0): the cost must be from 1 to 1000000000
}

func ExampleValidateKey() {
	for _, k := range []string{"github:org-1", "a{b}"} {
		fmt.Println(k, throttle.ValidateKey(k) == nil)
	}
	// Output:
	// github:org-1 true
	// a{b} false
}
