package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// procStopTimeout bounds how long a worker process may take to shut down
// after its standard input is closed.
const procStopTimeout = 15 * time.Second

// procFleet is the -procs fleet: worker processes of this same program,
// started with the hidden -worker flag, sharing nothing with the parent but
// Redis (and the providers' URLs).
type procFleet struct {
	cmds   []*exec.Cmd
	stdins []io.WriteCloser
	logEOF []chan struct{} // closed when a worker's stderr ends: it exited
}

// startProcs starts n worker processes of exe ("" means this program). Each
// one's log lines become events of disp.
func startProcs(exe string, spec nodeSpec, n int, disp *display) (*procFleet, error) {
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("-procs: find this program: %w", err)
		}
	}
	f := &procFleet{}
	for i := 1; i <= n; i++ {
		s := spec
		s.Name = fmt.Sprintf("w%d", i)
		js, err := json.Marshal(s)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(exe, "-worker", string(js))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			_ = f.stop()
			return nil, fmt.Errorf("-procs: start worker %s: %w", s.Name, err)
		}
		eof := make(chan struct{})
		f.cmds = append(f.cmds, cmd)
		f.stdins = append(f.stdins, stdin)
		f.logEOF = append(f.logEOF, eof)
		go func() {
			defer close(eof)
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				disp.event(s.Name + ": " + sc.Text())
			}
		}()
	}
	return f, nil
}

// stop closes every worker's standard input, which tells it to finish its
// running tasks and exit, and waits for all of them.
func (f *procFleet) stop() error {
	for _, in := range f.stdins {
		_ = in.Close()
	}
	var errs []error
	timer := time.NewTimer(procStopTimeout)
	defer timer.Stop()
	expired := false
	for i, cmd := range f.cmds {
		// Read its last log lines before Wait closes the pipe.
		if !expired {
			select {
			case <-f.logEOF[i]:
			case <-timer.C:
				expired = true
			}
		}
		if expired {
			select {
			case <-f.logEOF[i]:
			default:
				_ = cmd.Process.Kill()
				errs = append(errs, fmt.Errorf("worker w%d did not stop within %v; killed", i+1, procStopTimeout))
				<-f.logEOF[i]
			}
		}
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("worker w%d: %w", i+1, err))
		}
	}
	return errors.Join(errs...)
}
