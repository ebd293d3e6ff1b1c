package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server the harness started for itself: loopback
// only, a free port, a temp dir, no persistence. Stop kills it.
type redisServer struct {
	Addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// startRedis starts redis-server on a free 127.0.0.1 port and waits until
// it answers PING as the process we started (not another server that won
// the port).
func startRedis() (*redisServer, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server not on PATH (%v): install it or pass -redis URL", err)
	}
	dir, err := os.MkdirTemp("", "asynq-throttle-bench-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &redisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, done: make(chan struct{})}
		if lastErr = s.launch(port); lastErr == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("start redis-server: %w", lastErr)
}

func (s *redisServer) launch(port int) error {
	s.cmd = exec.Command("redis-server",
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "no",
		"--maxmemory-policy", "noeviction",
	)
	killWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.done)
	}()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 250 * time.Millisecond})
	defer c.Close()
	want := "process_id:" + strconv.Itoa(s.cmd.Process.Pid)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return errors.New("redis-server exited before it was ready (port taken?)")
		default:
		}
		info, err := c.Info(context.Background(), "server").Result()
		if err == nil {
			if strings.Contains(info, want) {
				return nil
			}
			s.Stop()
			return fmt.Errorf("another server answered on %s", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Stop()
	return fmt.Errorf("redis-server on %s not ready after 10s", s.Addr)
}

// Stop kills the server, waits for it and removes its directory.
func (s *redisServer) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
