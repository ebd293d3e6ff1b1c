package main

import (
	"fmt"
	"os"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// redisServer is a redis-server the harness started for itself, with
// internal/redistest as the tests start theirs: loopback only, a free port,
// a temp dir, no persistence. Stop kills it and removes the dir.
type redisServer struct {
	*redistest.Server
	dir string
}

// startRedis starts redis-server on a free 127.0.0.1 port and waits until
// it answers PING as the process we started.
func startRedis() (*redisServer, error) {
	dir, err := os.MkdirTemp("", "asynq-throttle-bench-")
	if err != nil {
		return nil, err
	}
	s, err := redistest.Launch(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%w\n(install redis-server or pass -redis URL)", err)
	}
	return &redisServer{Server: s, dir: dir}, nil
}

// Stop kills the server, waits for it and removes its directory.
func (s *redisServer) Stop() {
	s.Server.Stop()
	_ = os.RemoveAll(s.dir)
}
