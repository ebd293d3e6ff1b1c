package rules

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatPeriodWritesWhatOperatorsType(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Second: "s", time.Minute: "m", time.Hour: "h", 24 * time.Hour: "d",
		48 * time.Hour: "2d", 90 * time.Second: "90s", 1500 * time.Millisecond: "1500ms",
		time.Millisecond: "1ms", 36 * time.Hour: "36h", 30 * 24 * time.Hour: "30d", 1500 * time.Microsecond: "1.5ms",
	} {
		assert.Equal(t, want, FormatPeriod(d), "FormatPeriod(%v)", d)
		if d%time.Millisecond == 0 {
			back, err := ParsePeriod(want)
			require.NoError(t, err, "ParsePeriod(%q)", want)
			assert.Equal(t, d, back, "ParsePeriod(FormatPeriod(%v))", d)
		}
	}
}

func TestParsePeriodSaysWhatIsWrongInWords(t *testing.T) {
	for in, want := range map[string]time.Duration{"s": time.Second, "2d": 48 * time.Hour, "10s": 10 * time.Second, "1500ms": 1500 * time.Millisecond, "1m30s": 90 * time.Second, "30d": 30 * 24 * time.Hour, "720h": 30 * 24 * time.Hour} {
		got, err := ParsePeriod(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for in, says := range map[string]string{
		"31d":                   `the period "31d" is over 30 days, the longest a limit may have`,
		"721h":                  `the period "721h" is over 30 days`,
		"0s":                    `the period "0s" is zero`,
		"1500us":                `not a whole number of milliseconds`,
		"sec":                   `the period "sec" is not one: write s`,
		"min":                   `write m`,
		"2days":                 `write 2d`,
		"10minutes":             `write 10m`,
		"fortnight":             `the period "fortnight" is none of s, m, h, d`,
		"":                      `the period "" is none of`,
		"99999999999999999999d": `the period "99999999999999999999d" is none of`,
	} {
		_, err := ParsePeriod(in)
		if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), says, in)
		}
	}
	_, err := ParsePeriod("hours")
	var pe *PeriodError
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, "h", pe.Suggestion)
}

func TestTierWritesTheCLIsForm(t *testing.T) {
	assert.Equal(t, "2/s", Tier(KindBucket, 2, time.Second, 2, ""))
	assert.Equal(t, "10/s:burst=20", Tier(KindBucket, 10, time.Second, 20, "requests"))
	assert.Equal(t, "100/m:window", Tier(KindWindow, 100, time.Minute, 100, ""))
	assert.Equal(t, "5/2d:fixed:tokens", Tier(KindFixed, 5, 48*time.Hour, 0, "tokens"))
	assert.Equal(t, "99999999", Decimal(99999999))
	assert.Equal(t, "0.5", Decimal(0.5))
}
