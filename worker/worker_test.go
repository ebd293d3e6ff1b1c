package worker

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/deferral"
)

func TestConfigRecognisesDeferrals(t *testing.T) {
	errBenign := errors.New("benign")
	var handled []error
	type ctxKey struct{}
	cfg := Config(asynq.Config{
		IsFailure:      func(err error) bool { return !errors.Is(err, errBenign) },
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 42 * time.Second },
		ErrorHandler:   asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) { handled = append(handled, err) }),
		BaseContext:    func() context.Context { return context.WithValue(context.Background(), ctxKey{}, "user") },
	})
	def := fmt.Errorf("wrapped: %w", &deferral.Error{Key: "slack", Reason: "tier", Delay: 3 * time.Second})
	plain := errors.New("boom")
	task := asynq.NewTask("slack:sync", nil)

	assert.False(t, cfg.IsFailure(def), "a deferral is not a failure")
	assert.True(t, cfg.IsFailure(plain), "the user's IsFailure for other errors")
	assert.False(t, cfg.IsFailure(errBenign), "the user's IsFailure for other errors")

	assert.Equal(t, 3*time.Second, cfg.RetryDelayFunc(5, def, task), "a deferral's own delay")
	assert.Equal(t, 42*time.Second, cfg.RetryDelayFunc(5, plain, task), "the user's RetryDelayFunc")

	cfg.ErrorHandler.HandleError(context.Background(), task, def)
	cfg.ErrorHandler.HandleError(context.Background(), task, plain)
	assert.Equal(t, []error{plain}, handled, "the user's ErrorHandler never sees a deferral")

	ctx := cfg.BaseContext()
	assert.True(t, deferral.Marked(ctx), "contexts are marked for the retry path")
	assert.Equal(t, "user", ctx.Value(ctxKey{}), "the user's BaseContext is kept")

	assert.Equal(t, delayedTaskCheckInterval, cfg.DelayedTaskCheckInterval)
	assert.Equal(t, taskCheckInterval, cfg.TaskCheckInterval)

	assert.True(t, IsDeferral(def))
	assert.False(t, IsDeferral(plain))
}

func TestConfigKeepsTheUsersSettings(t *testing.T) {
	cfg := Config(asynq.Config{DelayedTaskCheckInterval: 3 * time.Second, TaskCheckInterval: time.Second})
	assert.Equal(t, 3*time.Second, cfg.DelayedTaskCheckInterval, "the user's interval is kept")
	assert.Equal(t, time.Second, cfg.TaskCheckInterval, "the user's interval is kept")
	assert.True(t, cfg.IsFailure(errors.New("x")), "asynq's default IsFailure: any error")
	assert.False(t, cfg.IsFailure(&deferral.Error{}))
	task := asynq.NewTask("t", nil)
	assert.Equal(t, asynq.DefaultRetryDelayFunc(2, errors.New("x"), task) > 0, cfg.RetryDelayFunc(2, errors.New("x"), task) > 0)
	assert.Nil(t, cfg.ErrorHandler, "no ErrorHandler is invented")
	assert.True(t, deferral.Marked(cfg.BaseContext()))
}

// NewServer's doc states the intervals Config sets.
func TestConfigDocStatesTheIntervals(t *testing.T) {
	src, err := os.ReadFile("worker.go")
	require.NoError(t, err)
	f, err := parser.ParseFile(token.NewFileSet(), "worker.go", src, parser.ParseComments)
	require.NoError(t, err)
	var doc string
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "NewServer" {
			doc = fd.Doc.Text()
		}
	}
	flat := strings.Join(strings.Fields(doc), " ")
	assert.Contains(t, flat, "DelayedTaskCheckInterval "+delayedTaskCheckInterval.String(), "NewServer's doc")
	assert.Contains(t, flat, "TaskCheckInterval "+taskCheckInterval.String(), "NewServer's doc")
}
