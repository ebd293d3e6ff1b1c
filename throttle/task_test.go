package throttle

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mustTask is NewTask for options a test knows are valid.
func mustTask(t testing.TB, typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	t.Helper()
	task, err := NewTask(typename, payload, opts...)
	require.NoError(t, err, "NewTask(%q)", typename)
	return task
}

func TestNewTaskCarriesKeyInHeaders(t *testing.T) {
	task := mustTask(t, "slack:sync_users", []byte("p"), Key("slack-workspace-1"), asynq.MaxRetry(3))
	assert.Equal(t, "slack-workspace-1", task.Headers()[HeaderKey])
	assert.Equal(t, "slack:sync_users", task.Type())
	assert.Equal(t, []byte("p"), task.Payload())
	assert.Equal(t, `throttle.Key("x")`, Key("x").(interface{ String() string }).String())

	// asynq.NewTask keeps no unknown option in any header: the key would be lost.
	plain := asynq.NewTask("slack:sync_users", nil, Key("slack"))
	assert.Empty(t, plain.Headers()[HeaderKey], "a Key outside NewTask is dropped, as its doc says")
}

// NewTask refuses, naming the option, what no worker could throttle; the
// worker would fail such a task (and Limiter.Enqueue refuses it too).
func TestNewTaskRefusesWhatNoWorkerCouldThrottle(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []asynq.Option
		want string
	}{
		{"a key of 1,000 bytes", []asynq.Option{Key(strings.Repeat("k", 1000))}, "Key: throttle: invalid key"},
		{"a key with a brace", []asynq.Option{Key("slack{x}")}, "must not contain '{' or '}'"},
		{"an empty key", []asynq.Option{Key("")}, "must not be empty"},
		{"two keys", []asynq.Option{Key("a"), Key("b")}, `a second Key (the first was "a")`},
		{"Cost(0)", []asynq.Option{Key("a"), Cost(0)}, "throttle.Cost(0): the cost must be from 1 to"},
		{"Cost(-3)", []asynq.Option{Key("a"), Cost(-3)}, "throttle.Cost(-3): the cost must be from 1 to"},
		{"two costs", []asynq.Option{Cost(2), Cost(3)}, "a second Cost"},
	} {
		task, err := NewTask("slack:sync", nil, tt.opts...)
		assert.Nil(t, task, "%s: a task", tt.name)
		require.Error(t, err, tt.name)
		assert.Contains(t, err.Error(), tt.want, tt.name)
		assert.Contains(t, err.Error(), `NewTask("slack:sync")`, tt.name)
	}
	_, err := NewTask("slack:sync", nil, Key("a{b}"))
	assert.ErrorIs(t, err, ErrInvalidKey)
}

func TestKeyOfPicksHeaderThenFunctionThenPrefix(t *testing.T) {
	byTenant := func(t *asynq.Task) string { return "tenant-" + string(t.Payload()) }
	tests := []struct {
		name    string
		task    *asynq.Task
		keyFunc func(*asynq.Task) string
		want    string
		wantErr string // "": none; else what the error names
	}{
		{"header wins", mustTask(t, "slack:sync", nil, Key("github")), byTenant, "github", ""},
		{"type prefix", asynq.NewTask("slack:sync_users", nil), nil, "slack", ""},
		{"type prefix, nested", asynq.NewTask("crm:hubspot:contacts", nil), nil, "crm", ""},
		{"no prefix: unthrottled", asynq.NewTask("cleanup", nil), nil, "", ""},
		{"leading colon: unthrottled", asynq.NewTask(":odd", nil), nil, "", ""},
		{"key func", asynq.NewTask("slack:sync", []byte("7")), byTenant, "tenant-7", ""},
		{"key func may say unthrottled", asynq.NewTask("slack:sync", nil), func(*asynq.Task) string { return "" }, "", ""},
		{"derived key that cannot be a key: unthrottled", asynq.NewTask("a{b}:x", nil), nil, "", ""},
		{"invalid header key is an error", asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{HeaderKey: "bad{key}"}), nil, "", HeaderKey},
		{"empty header key is an error", asynq.NewTaskWithHeaders("slack:sync", nil, map[string]string{HeaderKey: ""}), nil, "", HeaderKey},
		{"invalid key from the key func is an error", asynq.NewTask("slack:sync", []byte("{7}")), byTenant, "", "WithKeyFunc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOptions([]Option{WithKeyFunc(tt.keyFunc), WithLogger(slog.New(slog.DiscardHandler))})
			got, err := o.keyOf(tt.task)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrInvalidKey)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "keyOf(%q)", tt.task.Type())
		})
	}
}

func TestRoundUpLandsOnAWholeSecond(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 10, 300_000_000, time.UTC) // xx:10.3
	m := &middleware{now: func() time.Time { return base }}
	for _, tt := range []struct{ in, want time.Duration }{
		{0, 700 * time.Millisecond},
		{10 * time.Millisecond, 700 * time.Millisecond},
		{700 * time.Millisecond, 700 * time.Millisecond},
		{701 * time.Millisecond, 1700 * time.Millisecond},
		{5 * time.Second, 5700 * time.Millisecond},
	} {
		got := m.roundUp(tt.in)
		assert.Equal(t, tt.want, got, "roundUp(%v) at %v", tt.in, base)
		assert.GreaterOrEqual(t, got, tt.in, "roundUp(%v) is earlier", tt.in)
		assert.Zero(t, base.Add(got).Nanosecond(), "roundUp(%v) does not land on a second", tt.in)
	}
}

// A deferred task comes back at its reserved slot (paced: on the whole second
// before it), or, refused a slot in flight, when a slot is expected free,
// whether or not it holds a reservation, whose time may have passed.
func TestDeferDelayComesBackWhenItCanRun(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 10, 300_000_000, time.UTC) // xx:10.3
	m := &middleware{l: &Limiter{o: newOptions(nil)}, now: func() time.Time { return base }}
	for _, tt := range []struct {
		name string
		d    Decision
		want time.Duration
	}{
		{"reserved on a whole second", Decision{Reason: RefusedByTier, reserved: true, reservedAt: base.Add(1700 * time.Millisecond)}, 1700 * time.Millisecond},
		{"paced slot inside a second", Decision{Reason: RefusedByTier, reserved: true, reservedAt: base.Add(2100 * time.Millisecond)}, 1700 * time.Millisecond},
		{"refused a slot in flight", Decision{Reason: RefusedBySlots, RetryAfter: 3700 * time.Millisecond}, 3700 * time.Millisecond},
		// (Regression: such a task came back to its passed slot at once.)
		{"refused a slot in flight, holding a reservation that has passed", Decision{Reason: RefusedBySlots, RetryAfter: 3700 * time.Millisecond,
			reserved: true, reservedAt: base.Add(-2 * time.Second)}, 3700 * time.Millisecond},
	} {
		assert.Equal(t, tt.want, m.deferDelay(tt.d), "%s: deferDelay(%+v) at %v", tt.name, tt.d, base)
	}
}
