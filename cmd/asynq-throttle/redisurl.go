package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Connection settings of the CLI, unless the URL sets them: fail fast and
// once, an operator is waiting.
const (
	cliDialTimeout = 2 * time.Second
	cliReadTimeout = 3 * time.Second
)

// urlForms names the accepted Redis URLs, for errors.
const urlForms = "redis://host:port/db, rediss://..., unix:///path.sock, redis+sentinel://host:26379?master_name=NAME, redis+cluster://host:port?addr=host2:port2"

// openRedis returns a client for a standalone, Sentinel or Cluster URL.
// Retries are off and the dial timeout short unless the URL's query says
// otherwise (max_retries, dial_timeout, ...).
func openRedis(raw string) (redis.UniversalClient, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // without the URL, which may hold a password
		}
		return nil, fmt.Errorf("bad Redis URL: %v (want %s)", err, urlForms)
	}
	q := u.Query()
	base, kind, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" && !(base == "unix" && kind == "") {
		return nil, fmt.Errorf("bad Redis URL %q: scheme %q (want %s)", redactURL(raw), u.Scheme, urlForms)
	}
	plain := *u
	plain.Scheme = base
	switch kind {
	case "":
		o, err := redis.ParseURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		failFast(q, &o.MaxRetries, &o.DialTimeout, &o.ReadTimeout, &o.DialerRetries)
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("bad Redis URL %q: a Sentinel URL needs ?master_name=NAME", redactURL(raw))
		}
		failFast(q, &o.MaxRetries, &o.DialTimeout, &o.ReadTimeout, &o.DialerRetries)
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		failFast(q, &o.MaxRetries, &o.DialTimeout, &o.ReadTimeout, &o.DialerRetries)
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("bad Redis URL %q: scheme %q (want %s)", redactURL(raw), u.Scheme, urlForms)
}

// failFast applies the CLI's connection settings to what the URL's query
// q leaves unset: no retries, one dial attempt, short timeouts.
func failFast(q url.Values, maxRetries *int, dialTimeout, readTimeout *time.Duration, dialerRetries *int) {
	if !q.Has("max_retries") {
		*maxRetries = -1
	}
	if !q.Has("dial_timeout") {
		*dialTimeout = cliDialTimeout
	}
	if !q.Has("read_timeout") {
		*readTimeout = cliReadTimeout
	}
	if !q.Has("dialer_retries") {
		*dialerRetries = 1
	}
}

func badURL(raw string, err error) error {
	return fmt.Errorf("bad Redis URL %q: %v (want %s)", redactURL(raw), err, urlForms)
}

// redactURL hides the password of a URL in messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}
