// Command quickstart throttles a worker's calls to "slack" to 2 per second,
// fleet-wide, enqueues six tasks and runs them. It needs a Redis: REDIS_URL,
// default redis://localhost:6379/0.
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
	if err := run(ctx, cmp.Or(os.Getenv("REDIS_URL"), "redis://localhost:6379/0"), 6); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, url string, tasks int) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	opt.ContextTimeoutEnabled = true // decisions keep their own deadline
	rdb := redis.NewClient(opt)      // or a *redis.ClusterClient
	defer rdb.Close()

	// Limits live in Redis: every process obeys them from its next decision.
	lim := throttle.NewLimiter(rdb)
	if err := lim.SetLimits(ctx, "slack", throttle.PerSecond(2), throttle.PerMinute(50)); err != nil {
		return err
	}

	// Producers: the key travels in the task headers.
	client := asynq.NewClientFromRedisClient(rdb)
	for i := range tasks {
		task, err := throttle.NewTask("slack:sync_users", []byte(strconv.Itoa(i)), throttle.Key("slack"), asynq.MaxRetry(5))
		if err != nil {
			return err
		}
		if _, err := client.EnqueueContext(ctx, task); err != nil {
			return err
		}
	}

	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"ok":true}`)) // stands in for Slack's API
	}))
	defer api.Close()
	done := make(chan struct{}, tasks)

	// Workers: worker.NewServer makes deferrals exact (see Guarantees).
	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb))
	mux.HandleFunc("slack:sync_users", func(ctx context.Context, t *asynq.Task) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"/users.list", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		// Learns the quota the response states (RateLimit, X-RateLimit-*), fleet-wide.
		if err := throttle.Observe(ctx, resp); err != nil {
			return err // 429 (or 503 + Retry-After): suspends "slack" fleet-wide
		}
		// ... or, from an SDK error: return throttle.RateLimited(30 * time.Second)
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
