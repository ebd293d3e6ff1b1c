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
	unset := func(name string) bool { return !q.Has(name) }
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
		if unset("max_retries") {
			o.MaxRetries = -1
		}
		if unset("dial_timeout") {
			o.DialTimeout = cliDialTimeout
		}
		if unset("read_timeout") {
			o.ReadTimeout = cliReadTimeout
		}
		if unset("dialer_retries") {
			o.DialerRetries = 1
		}
		return redis.NewClient(o), nil
	case "sentinel":
		o, err := redis.ParseFailoverURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("bad Redis URL %q: a Sentinel URL needs ?master_name=NAME", redactURL(raw))
		}
		if unset("max_retries") {
			o.MaxRetries = -1
		}
		if unset("dial_timeout") {
			o.DialTimeout = cliDialTimeout
		}
		if unset("read_timeout") {
			o.ReadTimeout = cliReadTimeout
		}
		if unset("dialer_retries") {
			o.DialerRetries = 1
		}
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		if unset("max_retries") {
			o.MaxRetries = -1
		}
		if unset("dial_timeout") {
			o.DialTimeout = cliDialTimeout
		}
		if unset("read_timeout") {
			o.ReadTimeout = cliReadTimeout
		}
		if unset("dialer_retries") {
			o.DialerRetries = 1
		}
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("bad Redis URL %q: scheme %q (want %s)", redactURL(raw), u.Scheme, urlForms)
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
