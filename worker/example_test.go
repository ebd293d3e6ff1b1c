package worker_test

import (
	"context"
	"log"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
	"github.com/asynq-throttle/asynq-throttle/worker"
)

// A worker whose deferrals keep the task's ID and retry count: NewServer in
// place of asynq.NewServer, on the go-redis client the Limiter uses.
func ExampleNewServer() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	srv := worker.NewServer(rdb, asynq.Config{Concurrency: 20})
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb))
	mux.HandleFunc("slack:sync", func(ctx context.Context, t *asynq.Task) error {
		return nil // call Slack; return throttle.Observe(ctx, resp)
	})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// An asynq server kept on asynq's own RedisClientOpt: Config wraps the
// config as NewServer does.
func ExampleConfig() {
	opt := asynq.RedisClientOpt{Addr: "localhost:6379"}
	srv := asynq.NewServer(opt, worker.Config(asynq.Config{Concurrency: 20}))

	// The Limiter needs a go-redis client: the same address.
	rdb := redis.NewClient(&redis.Options{Addr: opt.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	mux := asynq.NewServeMux()
	mux.Use(throttle.ByProvider(rdb))
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}
