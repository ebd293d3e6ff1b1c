package dashboard_test

import (
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/dashboard"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// The web view of the Limiter the worker's middleware runs on, mounted under
// /throttle/ (beside asynqmon, say), with its actions turned on.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	lim := throttle.NewLimiter(rdb)
	// mux.Use(lim.Middleware()) in the worker: the page then shows its decisions.

	http.Handle("/throttle/", http.StripPrefix("/throttle", dashboard.New(lim, dashboard.WithReadOnly(false))))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", nil))
}
