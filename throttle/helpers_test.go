package throttle_test

import (
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// newTask is throttle.NewTask for options a test knows are valid.
func newTask(t testing.TB, typename string, payload []byte, opts ...asynq.Option) *asynq.Task {
	t.Helper()
	task, err := throttle.NewTask(typename, payload, opts...)
	require.NoError(t, err, "NewTask(%q)", typename)
	return task
}

// resumed is the error of Limiter.Resume.
func resumed(_ int, err error) error { return err }
