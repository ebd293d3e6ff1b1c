// Command quickstart is an asynq producer and worker that call "slack" at
// most twice a second, fleet-wide: it enqueues six tasks and runs a worker
// until they are done. It needs a Redis: REDIS_ADDR, default localhost:6379.
//
// It is the README's quick start, with a stand-in for Slack's API and a
// worker that stops once its tasks are done, so that its test can run it
// (the README's own program is built by TestREADMEQuickStartCompiles).
package main

import (
	"cmp"
	"context"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strconv"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cmp.Or(os.Getenv("REDIS_ADDR"), "localhost:6379"), 6); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr string, tasks int) error {
	// One go-redis client for asynq and the limiter (was: asynq.RedisClientOpt{Addr: addr}).
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)

	// A limit, stored in Redis: every process obeys it from its next decision.
	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerSecond(2), throttle.PerMinute(50)); err != nil {
		return err
	}

	// Producer: the key travels in the task's headers (asynq drops unknown options).
	for i := range tasks {
		payload := []byte(strconv.Itoa(i))
		task, err := throttle.NewTask("slack:sync_users", payload, throttle.Key("slack"))
		if err != nil {
			return err
		}
		if _, err := client.EnqueueContext(ctx, task); err != nil {
			return err
		}
	}

	// Stands in for Slack's API.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer api.Close()
	callSlack := func(ctx context.Context, t *asynq.Task) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/users.list?cursor="+string(t.Payload()), nil)
		if err != nil {
			return nil, err
		}
		return http.DefaultClient.Do(req)
	}
	done := make(chan struct{}, tasks)

	// Worker: worker.NewServer (was: asynq.NewServer) and the middleware.
	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
	mux := asynq.NewServeMux()
	mux.Use(lim.Middleware())
	mux.HandleFunc("slack:sync_users", func(ctx context.Context, t *asynq.Task) error {
		resp, err := callSlack(ctx, t)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Learns the quota the response states; a 429 suspends "slack" fleet-wide.
		if err := throttle.Observe(ctx, resp); err != nil {
			return err
		}
		log.Printf("task %s: slack answered %s", t.Payload(), resp.Status)
		done <- struct{}{}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return err
	}
	defer srv.Shutdown()
	for range tasks {
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
