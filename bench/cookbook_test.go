package main

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCookbookCapacityRefillsAtTheStatedRatesUpToAMinute: the script's
// arithmetic: a minute's worth at first and at most, refilled by
// max_x_per_minute * seconds / 60, both units taken or neither.
func TestCookbookCapacityRefillsAtTheStatedRatesUpToAMinute(t *testing.T) {
	c := newCookbookCapacity(60, 6000, at)
	assert.Equal(t, [2]float64{60, 6000}, [2]float64{c.requests, c.tokens}, "a minute's worth at first")
	require.True(t, c.take(6000))
	assert.Equal(t, [2]float64{59, 0}, [2]float64{c.requests, c.tokens})
	assert.False(t, c.take(1), "no token left")
	assert.Equal(t, 59.0, c.requests, "refused: no request taken")

	c.update(at.Add(500 * time.Millisecond))
	assert.InDelta(t, 59.5, c.requests, 1e-9, "1 request a second")
	assert.InDelta(t, 50, c.tokens, 1e-9, "100 tokens a second")
	c.update(at.Add(time.Second))
	assert.Equal(t, 60.0, c.requests, "capped at a minute's worth")
	assert.InDelta(t, 100, c.tokens, 1e-9)
	assert.True(t, c.take(100), "exactly enough")
	c.update(at.Add(time.Hour))
	assert.Equal(t, [2]float64{60, 6000}, [2]float64{c.requests, c.tokens})

	for range 60 {
		require.True(t, c.take(0))
	}
	assert.False(t, c.take(0), "no request left")
	assert.Equal(t, 6000.0, c.tokens, "refused: no token taken")
}

func TestCookbookPausesFifteenSecondsAfterTheLastRateLimitError(t *testing.T) {
	var s cookbookStatus
	assert.Zero(t, s.pauseLeft(at, cookbookPause), "no error yet")
	s.lastRateLimitError = at
	assert.Equal(t, 15*time.Second, s.pauseLeft(at, cookbookPause))
	assert.Equal(t, 10*time.Second, s.pauseLeft(at.Add(5*time.Second), cookbookPause))
	assert.Zero(t, s.pauseLeft(at.Add(15*time.Second), cookbookPause))
}

// fakeAPI answers the cookbook's calls: 429 to the first calls of the
// tasks in limited (as many as it says), 200 otherwise; it keeps the most
// calls it had at once.
type fakeAPI struct {
	mu               sync.Mutex
	limited          map[int]int
	calls, now, most int
	hold             time.Duration
}

func (f *fakeAPI) call(_ context.Context, t llmTask) (int, error) {
	f.mu.Lock()
	f.calls++
	f.now++
	f.most = max(f.most, f.now)
	n := f.limited[t.ID]
	f.limited[t.ID] = n - 1
	f.mu.Unlock()
	time.Sleep(f.hold)
	f.mu.Lock()
	f.now--
	f.mu.Unlock()
	if n > 0 {
		return http.StatusTooManyRequests, nil
	}
	return http.StatusOK, nil
}

func fileOf(tasks []llmTask) func() (llmTask, bool) {
	ch := make(chan llmTask, len(tasks))
	for _, t := range tasks {
		ch <- t
	}
	close(ch)
	return func() (llmTask, bool) {
		t, ok := <-ch
		return t, ok
	}
}

// TestCookbookRetriesAfterAPauseAndGivesUpAfterFiveAttempts: a 429 pauses
// the process and the request is retried; a request refused five times
// is given up; the capacity a refused call took is not given back.
func TestCookbookRetriesAfterAPauseAndGivesUpAfterFiveAttempts(t *testing.T) {
	api := &fakeAPI{limited: map[int]int{1: 1, 2: 99}}
	tasks := []llmTask{{ID: 0, Estimate: 10}, {ID: 1, Estimate: 10}, {ID: 2, Estimate: 10}, {ID: 3, Estimate: 10}}
	c := newCookbookInstance(60, 600000, 16, fileOf(tasks), api.call)
	c.pause = 20 * time.Millisecond
	began := time.Now()
	c.run(t.Context())
	s := c.snapshot()
	assert.Equal(t, [3]int{4, 3, 1}, [3]int{s.started, s.succeeded, s.failed}, "task 2 given up")
	assert.Equal(t, 0, s.inProgress)
	assert.Equal(t, 1+2+5+1, s.calls, "task 1 twice, task 2 five times")
	assert.Equal(t, 6, s.rateLimitErrors)
	assert.GreaterOrEqual(t, s.pauses, 5, "a pause after each 429 (task 2's retries come after one)")
	assert.GreaterOrEqual(t, time.Since(began), 5*c.pause)
	assert.GreaterOrEqual(t, c.cap.requests, 60.0-9, "9 calls taken (refused ones too)")
	assert.Less(t, c.cap.requests, 60.0-8, "and less than a second refilled at 1 a second")
}

func TestCookbookSendsOnlyWhatItsCapacityAndWorkersAllow(t *testing.T) {
	api := &fakeAPI{limited: map[int]int{}, hold: 20 * time.Millisecond}
	var tasks []llmTask
	for i := range 6 {
		tasks = append(tasks, llmTask{ID: i, Estimate: 1})
	}
	c := newCookbookInstance(6000, 600000, 2, fileOf(tasks), api.call)
	c.run(t.Context())
	assert.Equal(t, 6, c.snapshot().succeeded)
	assert.Equal(t, 2, api.most, "2 workers: at most 2 calls at once")

	// 10 RPM: the first 10 at once (one per pass of the loop), the next
	// 6 s later.
	tasks = make([]llmTask, 12)
	for i := range tasks {
		tasks[i] = llmTask{ID: i}
	}
	api = &fakeAPI{limited: map[int]int{}}
	c = newCookbookInstance(10, 1000, 200, fileOf(tasks), api.call)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	c.run(ctx)
	assert.Equal(t, 10, c.snapshot().calls, "a minute's worth at once, nothing more in 500 ms")
}

// TestCookbookReadsTheWholeFileWhenCallsEndAtOnce: a call that ends before
// the loop looks again (a 429 comes back in microseconds) does not end the
// process while the file still has lines.
func TestCookbookReadsTheWholeFileWhenCallsEndAtOnce(t *testing.T) {
	for range 20 {
		tasks := make([]llmTask, 30)
		for i := range tasks {
			tasks[i] = llmTask{ID: i}
		}
		c := newCookbookInstance(6000, 1000, 16, fileOf(tasks), (&fakeAPI{limited: map[int]int{}}).call)
		c.run(t.Context())
		require.Equal(t, 30, c.snapshot().succeeded)
	}
}
