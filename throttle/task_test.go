package throttle

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewTaskCarriesKeyInHeaders(t *testing.T) {
	task := NewTask("slack:sync_users", []byte("p"), Key("slack-workspace-1"), asynq.MaxRetry(3))
	assert.Equal(t, "slack-workspace-1", KeyOf(task))
	assert.Equal(t, "slack-workspace-1", task.Headers()[HeaderKey])
	assert.Equal(t, "slack:sync_users", task.Type())
	assert.Equal(t, []byte("p"), task.Payload())
	assert.Equal(t, `throttle.Key("x")`, Key("x").(interface{ String() string }).String())

	// asynq.NewTask keeps no unknown option in any header: the key would be lost.
	plain := asynq.NewTask("slack:sync_users", nil, Key("slack"))
	assert.Empty(t, KeyOf(plain), "a Key outside NewTask is dropped, as its doc says")
}

func TestKeyOf(t *testing.T) {
	byTenant := func(t *asynq.Task) string { return "tenant-" + string(t.Payload()) }
	tests := []struct {
		name    string
		task    *asynq.Task
		keyFunc func(*asynq.Task) string
		want    string
		wantErr bool
	}{
		{"header wins", NewTask("slack:sync", nil, Key("github")), byTenant, "github", false},
		{"type prefix", asynq.NewTask("slack:sync_users", nil), nil, "slack", false},
		{"type prefix, nested", asynq.NewTask("crm:hubspot:contacts", nil), nil, "crm", false},
		{"no prefix: unthrottled", asynq.NewTask("cleanup", nil), nil, "", false},
		{"leading colon: unthrottled", asynq.NewTask(":odd", nil), nil, "", false},
		{"key func", asynq.NewTask("slack:sync", []byte("7")), byTenant, "tenant-7", false},
		{"key func may say unthrottled", asynq.NewTask("slack:sync", nil), func(*asynq.Task) string { return "" }, "", false},
		{"derived key that cannot be a key: unthrottled", asynq.NewTask("a{b}:x", nil), nil, "", false},
		{"invalid header key is an error", NewTask("slack:sync", nil, Key("bad{key}")), nil, "", true},
		{"empty header key is an error", NewTask("slack:sync", nil, Key("")), nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOptions([]Option{WithKeyFunc(tt.keyFunc)})
			got, err := o.keyOf(tt.task)
			if tt.wantErr {
				require.ErrorIs(t, err, ErrInvalidKey)
				assert.Contains(t, err.Error(), HeaderKey)
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

func TestKeyNameRules(t *testing.T) {
	ok := []string{"slack", "github:org-1", "ünïcode", "with space", strings.Repeat("k", MaxKeyLen)}
	for _, k := range ok {
		assert.NoError(t, ValidateKey(k), "ValidateKey(%q)", k)
	}
	bad := []string{"", strings.Repeat("k", MaxKeyLen+1), "a{b", "a}b", "nul\x00", "tab\t", "\xff\xfe"}
	for _, k := range bad {
		assert.ErrorIs(t, ValidateKey(k), ErrInvalidKey, "ValidateKey(%q)", k)
	}
}
