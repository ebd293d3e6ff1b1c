package redistest

import "time"

// LagMeter measures how late this process wakes from a short sleep: on a
// loaded machine a goroutine whose timer fired waits that long more for a
// CPU, so a call ended by a timeout returns that much later. Tests that
// bound how long a call takes allow for the worst lag seen meanwhile.
type LagMeter struct {
	stop chan struct{}
	done chan time.Duration
}

// StartLagMeter starts measuring; End stops it.
func StartLagMeter() *LagMeter {
	m := &LagMeter{stop: make(chan struct{}), done: make(chan time.Duration, 1)}
	go func() {
		const tick = 10 * time.Millisecond
		var worst time.Duration
		for {
			select {
			case <-m.stop:
				m.done <- worst
				return
			default:
			}
			from := time.Now()
			time.Sleep(tick)
			worst = max(worst, time.Since(from)-tick)
		}
	}()
	return m
}

// End stops the meter and returns the longest lag it saw.
func (m *LagMeter) End() time.Duration {
	close(m.stop)
	return <-m.done
}
