package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
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

// openRedis returns a client for a standalone, Sentinel or Cluster URL,
// or for host:port (as redis-cli -h/-p, and asynq's RedisClientOpt.Addr,
// take it) and a socket's path. Retries are off and the dial timeout short
// unless the URL's query says otherwise (max_retries, dial_timeout, ...).
//
// tlsConf (nil: none) turns TLS on with its CA and client certificate,
// whatever the scheme; on a rediss:// URL it adds them to what the URL
// sets.
func openRedis(raw string, tlsConf *tls.Config) (redis.UniversalClient, error) {
	raw = withScheme(raw)
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
		o.TLSConfig = withTLS(o.TLSConfig, tlsConf, o.Addr)
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
		o.TLSConfig = withTLS(o.TLSConfig, tlsConf, "")
		return redis.NewFailoverClient(o), nil
	case "cluster":
		o, err := redis.ParseClusterURL(plain.String())
		if err != nil {
			return nil, badURL(raw, err)
		}
		failFast(q, &o.MaxRetries, &o.DialTimeout, &o.ReadTimeout, &o.DialerRetries)
		addr := ""
		if len(o.Addrs) > 0 {
			addr = o.Addrs[0]
		}
		o.TLSConfig = withTLS(o.TLSConfig, tlsConf, addr)
		return redis.NewClusterClient(o), nil
	}
	return nil, fmt.Errorf("bad Redis URL %q: scheme %q (want %s)", redactURL(raw), u.Scheme, urlForms)
}

// withTLS is the TLS of a client: the URL's (have, nil for redis://) with
// the flags' CA and certificate (flags, nil for none). The server's name
// is checked against addr's host, as rediss:// does.
func withTLS(have, flags *tls.Config, addr string) *tls.Config {
	if flags == nil {
		return have
	}
	c := flags.Clone()
	if have != nil {
		c.ServerName = have.ServerName
	} else if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	return c
}

// withScheme makes a URL of what has no scheme: "127.0.0.1:6379" and
// "localhost" are redis://..., "/run/redis.sock" is unix://...
func withScheme(raw string) string {
	switch {
	case raw == "" || strings.Contains(raw, "://"):
		return raw
	case strings.HasPrefix(raw, "/"):
		return "unix://" + raw
	}
	return "redis://" + raw
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

// redacted stands for a credential in messages.
const redacted = "xxxxx"

// secretQuery matches a query parameter that holds a credential
// (password, sentinel_password, ...) and its value.
var secretQuery = regexp.MustCompile(`(?i)((?:^|[?&;])[^=&;]*(?:password|passwd|pass|secret|token|key)[^=&;]*=)[^&;#]*`)

// userInfo matches the user:password@ of a URL that url.Parse refuses.
var userInfo = regexp.MustCompile(`(://[^/@?#]*?:)[^/@?#]*@`)

// redactURL hides every credential of a Redis URL in messages: the
// password of user:password@, and any query parameter that holds one
// (go-redis's password= and sentinel_password=, among others), whether or
// not the URL parses.
func redactURL(raw string) string {
	raw = withScheme(raw)
	u, err := url.Parse(raw)
	if err != nil {
		s := userInfo.ReplaceAllString(raw, "${1}"+redacted+"@")
		return secretQuery.ReplaceAllString(s, "${1}"+redacted)
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), redacted)
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k, vs := range q {
			if secretQuery.MatchString(k + "=") {
				for i := range vs {
					vs[i] = redacted
				}
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}
