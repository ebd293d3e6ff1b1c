package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
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
	return mr, redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
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
	st, _ := lim.Inspect(ctx, "github")
	fmt.Println(st.Limits)

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

// The middleware decides before each handler. Of a full bucket of three
// calls a minute it keeps a sliver for dispatch jitter (WithHeadroom: 20ms
// of the rate), so two tasks run at once and the third is deferred. In a
// server built by worker.NewServer a deferred task goes back to asynq's
// retry set to run later; called by hand as here, outside an asynq server,
// the middleware enqueues a copy of it to run later instead.
func ExampleLimiter_Middleware() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerMinute(3)); err != nil {
		fmt.Println(err)
		return
	}
	lim.OnEvent(func(ev throttle.Event) {
		fmt.Printf("%s: %s %s, handler ran: %v\n", ev.Key, ev.Outcome, ev.Reason, ev.HandlerRan)
	})

	// mux.Use(lim.Middleware()) in a worker; called by hand here.
	h := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		fmt.Printf("handler: %s %s\n", t.Type(), t.Payload())
		return nil
	}))
	for _, user := range []string{"U1", "U2", "U3"} {
		task, err := throttle.NewTask("slack:sync", []byte(user), throttle.Key("slack"))
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := h.ProcessTask(ctx, task); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// slack: ran allowed, handler ran: true
	// handler: slack:sync U1
	// slack: ran allowed, handler ran: true
	// handler: slack:sync U2
	// slack: deferred tier, handler ran: false
}

// Observe in a handler reads the provider's response: a 429 suspends the
// task's key for the whole fleet, for the Retry-After the provider sent.
func ExampleObserve() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerSecond(10)); err != nil {
		fmt.Println(err)
		return
	}
	h := lim.Middleware()(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		// The provider's answer; a real handler gets it from http.Client.Do.
		rec := httptest.NewRecorder()
		rec.Header().Set("Retry-After", "30")
		rec.WriteHeader(http.StatusTooManyRequests)
		resp := rec.Result()
		defer resp.Body.Close()

		err := throttle.Observe(ctx, resp)
		fmt.Println("handler:", err)
		return err // the middleware suspends "slack" and defers the task
	}))
	task, err := throttle.NewTask("slack:sync", nil, throttle.Key("slack"))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = h.ProcessTask(ctx, task)

	st, _ := lim.Inspect(ctx, "slack")
	fmt.Println("suspended for", st.SuspendedFor)
	d, _ := lim.Take(ctx, "slack")
	fmt.Println(d.Allowed, d.Reason, d.RetryAfter)
	// Output:
	// handler: throttle: rate limited by provider, retry after 30s
	// suspended for 30s
	// false suspended 30s
}

// Limiter.Enqueue takes the decision when a task is enqueued: a task that
// may run now is enqueued as usual (pending), and one that may not is
// scheduled for the run time it reserved, so a worker dequeues it once.
func ExampleLimiter_Enqueue() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()
	// asynq schedules on this process's clock, in whole seconds.
	mr.SetTime(time.Now().Truncate(time.Second))

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerMinute(3)); err != nil {
		fmt.Println(err)
		return
	}
	client := asynq.NewClientFromRedisClient(rdb) // leaves rdb open
	for _, user := range []string{"U1", "U2", "U3"} {
		task, err := throttle.NewTask("slack:sync", []byte(user), throttle.Key("slack"))
		if err != nil {
			fmt.Println(err)
			return
		}
		info, err := lim.Enqueue(ctx, client, task)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(user, info.State)
	}
	st, _ := lim.Inspect(ctx, "slack")
	fmt.Println("reserved run times:", st.Reservations)
	// Output:
	// U1 pending
	// U2 pending
	// U3 scheduled
	// reserved run times: 3
}

// InFlight caps the calls running at once. A direct caller holds the
// Decision's Slot until its call is done, then gives it back with Release
// (the middleware does both around each handler).
func ExampleInFlight() {
	mr, rdb := exampleRedis()
	defer mr.Close()
	defer rdb.Close()
	ctx := context.Background()

	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "stripe", throttle.PerSecond(100), throttle.InFlight(1)); err != nil {
		fmt.Println(err)
		return
	}
	first, _ := lim.Take(ctx, "stripe")
	fmt.Println("first:", first.Allowed, first.Slot != "")

	second, _ := lim.Take(ctx, "stripe")
	fmt.Println("second:", second.Allowed, second.Reason)

	if err := lim.Release(ctx, "stripe", first.Slot); err != nil {
		fmt.Println(err)
		return
	}
	third, _ := lim.Take(ctx, "stripe")
	fmt.Println("after Release:", third.Allowed)
	// Output:
	// first: true true
	// second: false in flight
	// after Release: true
}
