package main

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// A port of the OpenAI cookbook's parallel processor, the baseline of
// scenario L: examples/api_request_parallel_processor.py in
// github.com/openai/openai-cookbook (read at commit 04a3090348d4, function
// process_api_requests_from_file and APIRequest.call_api). Its logic, kept:
//
//   - available_request_capacity and available_token_capacity start at
//     max_requests_per_minute and max_tokens_per_minute and, on every pass
//     of the main loop, grow by max_x_per_minute * seconds_since_update / 60,
//     capped at max_x_per_minute (a minute's worth);
//   - the loop holds one next_request (a retry first, else the next line of
//     the file) and sends it when available_request_capacity >= 1 and
//     available_token_capacity >= its token_consumption, taking both (its
//     estimate: prompt + n * max_tokens, num_tokens_consumed_from_request);
//     attempts_left is decremented at each send (max_attempts 5);
//   - a failed request goes to queue_of_requests_to_retry while it has
//     attempts left, else it is counted failed; the capacity it took is
//     never given back;
//   - the loop sleeps 1 ms (seconds_to_sleep_each_loop) per pass and, if a
//     rate-limit error came less than 15 s ago
//     (seconds_to_pause_after_rate_limit_error), sleeps the rest of those
//     15 s: no request of the process is sent meanwhile;
//   - it ends when num_tasks_in_progress is 0 (a call the loop starts
//     cannot end before the loop's next sleep, in asyncio: there, no task
//     in progress means the file is read to its end; here a call runs at
//     once, so the port also checks that the file is read).
//
// Two departures, both to run it here: the loop sends only while fewer than
// workers calls are in flight (the script bounds nothing; scenario L gives
// each process 16 workers, as an asynq server of concurrency 16), and a
// rate-limit error is a 429. (The script at that commit compares the error
// body's code with '429'; OpenAI's 429 body says "rate_limit_exceeded", so
// as written it would count the error but never pause. Earlier versions
// matched "Rate limit" in the error message, as this provider's 429 body
// says: the pause is what the script means to do.)

// Constants of the cookbook's script.
const (
	cookbookPause       = 15 * time.Second // seconds_to_pause_after_rate_limit_error
	cookbookLoopSleep   = time.Millisecond // seconds_to_sleep_each_loop
	cookbookMaxAttempts = 5                // --max_attempts default
)

// cookbookCapacity is the script's in-process capacity tracking.
type cookbookCapacity struct {
	maxRequests, maxTokens float64 // per minute
	requests, tokens       float64 // available_request_capacity, available_token_capacity
	last                   time.Time
}

func newCookbookCapacity(rpm, tpm float64, now time.Time) cookbookCapacity {
	return cookbookCapacity{maxRequests: rpm, maxTokens: tpm, requests: rpm, tokens: tpm, last: now}
}

// update adds what the per-minute rates gave since the last update, each
// capped at a minute's worth ("update available capacity").
func (c *cookbookCapacity) update(now time.Time) {
	s := now.Sub(c.last).Seconds()
	c.requests = min(c.requests+c.maxRequests*s/60, c.maxRequests)
	c.tokens = min(c.tokens+c.maxTokens*s/60, c.maxTokens)
	c.last = now
}

// take takes 1 request and tokens if both are available, else nothing
// ("if enough capacity available, call API").
func (c *cookbookCapacity) take(tokens int) bool {
	if c.requests >= 1 && c.tokens >= float64(tokens) {
		c.requests--
		c.tokens -= float64(tokens)
		return true
	}
	return false
}

// cookbookRequest is the script's APIRequest.
type cookbookRequest struct {
	task         llmTask
	attemptsLeft int
}

// cookbookStatus is the script's StatusTracker, and what the port adds.
type cookbookStatus struct {
	started, inProgress, succeeded, failed int
	rateLimitErrors, otherErrors           int
	lastRateLimitError                     time.Time // time_of_last_rate_limit_error
	// The port's: calls in flight, pauses begun, calls made.
	inFlight, pauses, calls int
}

// pauseLeft is what is left of the cool-down after the last rate-limit
// error, at now (0: none).
func (s *cookbookStatus) pauseLeft(now time.Time, pause time.Duration) time.Duration {
	if s.lastRateLimitError.IsZero() {
		return 0
	}
	return max(pause-now.Sub(s.lastRateLimitError), 0)
}

// cookbookInstance is one process running the script.
type cookbookInstance struct {
	cap     cookbookCapacity
	workers int
	pause   time.Duration
	// next reads the next line of the "file": false once it is empty.
	next func() (llmTask, bool)
	// call calls the API for t and returns the response's status.
	call func(ctx context.Context, t llmTask) (int, error)

	mu     sync.Mutex
	retry  []*cookbookRequest // queue_of_requests_to_retry
	status cookbookStatus
	wg     sync.WaitGroup
}

func newCookbookInstance(rpm, tpm, workers int, next func() (llmTask, bool), call func(context.Context, llmTask) (int, error)) *cookbookInstance {
	return &cookbookInstance{cap: newCookbookCapacity(float64(rpm), float64(tpm), time.Now()), workers: workers,
		pause: cookbookPause, next: next, call: call}
}

// run is the script's main loop; it returns when no task is in progress or
// ctx ends (then after the calls in flight).
func (c *cookbookInstance) run(ctx context.Context) {
	defer c.wg.Wait()
	var next *cookbookRequest
	fileNotFinished := true
	c.cap.last = time.Now()
	for {
		if next == nil {
			next, fileNotFinished = c.nextRequest(fileNotFinished)
		}
		c.cap.update(time.Now())
		if next != nil && c.send(ctx, next) {
			next = nil
		}
		if c.inProgress() == 0 && !fileNotFinished {
			return
		}
		if sleepCtx(ctx, cookbookLoopSleep) != nil {
			return
		}
		if left := c.pauseLeft(); left > 0 {
			if sleepCtx(ctx, left) != nil {
				return
			}
		}
	}
}

// nextRequest is a retry if one waits, else the file's next line.
func (c *cookbookInstance) nextRequest(fileNotFinished bool) (*cookbookRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.retry) > 0 {
		r := c.retry[0]
		c.retry = c.retry[1:]
		return r, fileNotFinished
	}
	if !fileNotFinished {
		return nil, false
	}
	t, ok := c.next()
	if !ok {
		return nil, false
	}
	c.status.started++
	c.status.inProgress++
	return &cookbookRequest{task: t, attemptsLeft: cookbookMaxAttempts}, true
}

// send calls the API for r if a worker is free and the capacity holds its
// estimate.
func (c *cookbookInstance) send(ctx context.Context, r *cookbookRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status.inFlight >= c.workers || !c.cap.take(r.task.Estimate) {
		return false
	}
	r.attemptsLeft--
	c.status.inFlight++
	c.status.calls++
	c.wg.Go(func() { c.callAPI(ctx, r) })
	return true
}

// callAPI is APIRequest.call_api: a 429 is a rate-limit error (its time
// starts the pause), any other failure an error; a failed request is
// retried while it has attempts left.
func (c *cookbookInstance) callAPI(ctx context.Context, r *cookbookRequest) {
	status, err := c.call(ctx, r.task)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status.inFlight--
	switch {
	case err == nil && status == http.StatusOK:
		c.status.inProgress--
		c.status.succeeded++
		return
	case err == nil && status == http.StatusTooManyRequests:
		c.status.rateLimitErrors++
		c.status.lastRateLimitError = time.Now()
	default:
		c.status.otherErrors++
	}
	if r.attemptsLeft > 0 {
		c.retry = append(c.retry, r)
		return
	}
	c.status.inProgress--
	c.status.failed++
}

func (c *cookbookInstance) inProgress() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status.inProgress
}

// pauseLeft is the cool-down left now; a pause that begins is counted.
func (c *cookbookInstance) pauseLeft() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	left := c.status.pauseLeft(time.Now(), c.pause)
	if left > 0 {
		c.status.pauses++
	}
	return left
}

func (c *cookbookInstance) snapshot() cookbookStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}
