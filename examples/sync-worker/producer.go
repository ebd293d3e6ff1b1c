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

// producer enqueues a run's jobs: a backlog at the start, for a provider
// with a Stream, the second half of its jobs one by one, as events
// (webhooks, say) arrive, and for a provider with Tenants, the light
// customer's jobs together, a little later. Each job is a task whose ID is
// the job's, with its provider as throttle key and its customer, if any, as
// tenant; completed tasks are retained so that the audit finds every one
// of them. It is safe for concurrent use.
type producer struct {
	client *asynq.Client
	run    string
	specs  []ProviderSpec
	// ids are every job's ID, per provider, in the order they are enqueued.
	ids map[string][]string
	// tenant is each job's customer (throttle.Tenant), if it has one.
	tenant map[string]string

	mu       sync.Mutex
	enqueued map[string]time.Time // job ID -> when its task was enqueued
}

func newProducer(rdb redis.UniversalClient, run string, specs []ProviderSpec, jobs int) *producer {
	p := &producer{client: asynq.NewClientFromRedisClient(rdb), run: run, specs: specs,
		ids: map[string][]string{}, tenant: map[string]string{}, enqueued: map[string]time.Time{}}
	for _, spec := range specs {
		light := spec.Tenants.lightJobs(jobs)
		for i := range jobs {
			id := fmt.Sprintf("%s-%03d", spec.Name, i+1)
			p.ids[spec.Name] = append(p.ids[spec.Name], id)
			switch {
			case spec.Tenants.Heavy == "":
			case i >= jobs-light:
				p.tenant[id] = spec.Tenants.Light
			default:
				p.tenant[id] = spec.Tenants.Heavy
			}
		}
	}
	return p
}

// tenantJobs returns the IDs of tenant's jobs on provider, in order.
func (p *producer) tenantJobs(provider, tenant string) []string {
	var out []string
	for _, id := range p.ids[provider] {
		if p.tenant[id] == tenant {
			out = append(out, id)
		}
	}
	return out
}

// streamed reports how many of spec's jobs arrive one by one.
func streamed(spec ProviderSpec, jobs int) int {
	if spec.Stream.Rate <= 0 {
		return 0
	}
	return jobs / 2
}

// arriving reports how many of spec's jobs are not in the backlog: they
// stream, or are a light customer's, arriving later.
func arriving(spec ProviderSpec, jobs int) int {
	return streamed(spec, jobs) + spec.Tenants.lightJobs(jobs)
}

// enqueueBacklog enqueues every job that does not arrive later,
// interleaved across providers.
func (p *producer) enqueueBacklog(ctx context.Context) error {
	for i := 0; ; i++ {
		more := false
		for _, spec := range p.specs {
			ids := p.ids[spec.Name]
			if i >= len(ids)-arriving(spec, len(ids)) {
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

// stream enqueues the jobs of each provider that arrive after the backlog,
// counting from start, until they are all in or ctx ends: the streamed ones
// as its Stream says, and a light customer's all at once at its LightAt.
func (p *producer) stream(ctx context.Context, start time.Time) error {
	type next struct {
		spec  ProviderSpec
		ids   []string
		from  time.Duration
		every time.Duration
	}
	var streams []next
	for _, spec := range p.specs {
		ids := p.ids[spec.Name]
		if n := streamed(spec, len(ids)); n > 0 {
			every := time.Duration(float64(time.Second) / spec.Stream.Rate)
			streams = append(streams, next{spec, ids[len(ids)-n:], spec.Stream.From, every})
		}
		if n := spec.Tenants.lightJobs(len(ids)); n > 0 {
			streams = append(streams, next{spec, ids[len(ids)-n:], spec.Tenants.LightAt, 0})
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(streams))
	for _, s := range streams {
		wg.Go(func() {
			for k, id := range s.ids {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(start.Add(s.from + time.Duration(k)*s.every))):
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
	opts := []asynq.Option{throttle.Key(spec.Name)}
	if tenant := p.tenant[id]; tenant != "" {
		opts = append(opts, throttle.Tenant(tenant))
	}
	t, err := throttle.NewTask(spec.TaskType, payload, opts...)
	if err != nil {
		return err
	}
	if _, err := p.client.EnqueueContext(ctx, t,
		asynq.Queue(queueName(p.run)), asynq.TaskID(id), asynq.Retention(ledgerTTL)); err != nil {
		return fmt.Errorf("enqueue %s: %w", id, err)
	}
	p.mu.Lock()
	p.enqueued[id] = time.Now()
	p.mu.Unlock()
	return nil
}

// sent reports whether job id was enqueued.
func (p *producer) sent(id string) bool {
	_, ok := p.sentAt(id)
	return ok
}

// sentAt returns when job id was enqueued.
func (p *producer) sentAt(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.enqueued[id]
	return at, ok
}
