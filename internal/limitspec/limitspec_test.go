package limitspec_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/limitspec"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want throttle.Limit
		back string // Format of the result, when it differs from spec
	}{
		{"10/s", throttle.PerSecond(10), ""},
		{"50/m", throttle.PerMinute(50), ""},
		{"5000/h", throttle.PerHour(5000), ""},
		{"7/d", throttle.Limit{Rate: 7, Per: 24 * time.Hour}, ""},
		{"100/1500ms", throttle.Limit{Rate: 100, Per: 1500 * time.Millisecond}, "100/1.5s"},
		{"10/s:burst=20", throttle.PerSecond(10).WithBurst(20), ""},
		{"10/s:burst=10", throttle.PerSecond(10).WithBurst(10), "10/s"},
		{"3/90s", throttle.Limit{Rate: 3, Per: 90 * time.Second}, "3/1m30s"},
		{"3/1m", throttle.PerMinute(3), "3/m"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := limitspec.Parse(tc.spec)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			back := tc.back
			if back == "" {
				back = tc.spec
			}
			assert.Equal(t, back, limitspec.Format(got))
			again, err := limitspec.Parse(limitspec.Format(got))
			require.NoError(t, err)
			assert.Equal(t, limitspec.Burst(got), limitspec.Burst(again))
			assert.Equal(t, got.Per, again.Per)
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, spec := range []string{"10/fortnight", "10", "ten/s", "0/s", "-1/s", "10/-1s", "10/s:burst=0", "10/s:b=2", "10/s:burst=x", ""} {
		t.Run(spec, func(t *testing.T) {
			_, err := limitspec.Parse(spec)
			require.ErrorIs(t, err, limitspec.ErrSyntax)
			assert.Contains(t, err.Error(), "10/s:burst=20", "the error names the accepted forms")
		})
	}
	_, err := limitspec.ParseAll(" ")
	assert.ErrorIs(t, err, limitspec.ErrSyntax)
	ls, err := limitspec.ParseAll("10/s 50/m", "1/h")
	require.NoError(t, err)
	assert.Equal(t, "10/s 50/m 1/h", limitspec.FormatAll(ls))
}
