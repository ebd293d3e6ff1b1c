package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// producer enqueues a run's jobs: a backlog at the start, and for a
// provider with a Stream, the second half of its jobs one by one, as
// events (webhooks, say) arrive. Each job is a task whose ID is the job's,
// with its provider as throttle key; completed tasks are retained so that
// the audit finds every one of them. It is safe for concurrent use.
type producer struct {
	client *asynq.Client
	run    string
	specs  []ProviderSpec
	// ids are every job's ID, per provider, in the order they are enqueued.
	ids map[string][]string

	mu       sync.Mutex
	enqueued map[string]bool
}

func newProducer(rdb redis.UniversalClient, run string, specs []ProviderSpec, jobs int) *producer {
	p := &producer{client: asynq.NewClientFromRedisClient(rdb), run: run, specs: specs,
		ids: map[string][]string{}, enqueued: map[string]bool{}}
	for _, spec := range specs {
		for i := range jobs {
			p.ids[spec.Name] = append(p.ids[spec.Name], fmt.Sprintf("%s-%03d", spec.Name, i+1))
		}
	}
	return p
}

// streamed reports how many of spec's jobs arrive one by one.
func streamed(spec ProviderSpec, jobs int) int {
	if spec.Stream.Rate <= 0 {
		return 0
	}
	return jobs / 2
}

// enqueueBacklog enqueues every job that does not stream, interleaved
// across providers.
func (p *producer) enqueueBacklog(ctx context.Context) error {
	for i := 0; ; i++ {
		more := false
		for _, spec := range p.specs {
			ids := p.ids[spec.Name]
			if i >= len(ids)-streamed(spec, len(ids)) {
				continue
			}
			more = true
			if err := p.enqueue(ctx, spec, ids[i]); err != nil {
				return err
			}
		}
		if !more {
			return nil
		}
	}
}

// stream enqueues the streamed jobs of each provider as its Stream says,
// counting from start, until they are all in or ctx ends.
func (p *producer) stream(ctx context.Context, start time.Time) error {
	type next struct {
		spec ProviderSpec
		ids  []string
	}
	var streams []next
	for _, spec := range p.specs {
		ids := p.ids[spec.Name]
		if n := streamed(spec, len(ids)); n > 0 {
			streams = append(streams, next{spec, ids[len(ids)-n:]})
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(streams))
	for _, s := range streams {
		wg.Go(func() {
			every := time.Duration(float64(time.Second) / s.spec.Stream.Rate)
			for k, id := range s.ids {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(start.Add(s.spec.Stream.From + time.Duration(k)*every))):
				}
				if err := p.enqueue(ctx, s.spec, id); err != nil && ctx.Err() == nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// enqueue puts one sync task for job id of spec in the run's queue.
func (p *producer) enqueue(ctx context.Context, spec ProviderSpec, id string) error {
	payload, err := json.Marshal(job{ID: id, Account: "acct-" + id[len(id)-1:]})
	if err != nil {
		return err
	}
	t, err := throttle.NewTask(spec.TaskType, payload, throttle.Key(spec.Name))
	if err != nil {
		return err
	}
	if _, err := p.client.EnqueueContext(ctx, t,
		asynq.Queue(queueName(p.run)), asynq.TaskID(id), asynq.Retention(ledgerTTL)); err != nil {
		return fmt.Errorf("enqueue %s: %w", id, err)
	}
	p.mu.Lock()
	p.enqueued[id] = true
	p.mu.Unlock()
	return nil
}

// sent reports whether job id was enqueued.
func (p *producer) sent(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.enqueued[id]
}
