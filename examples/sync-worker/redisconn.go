package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// acceptedRedisURLs lists the forms -redis and REDIS_URL take.
const acceptedRedisURLs = `accepted forms:
  redis://[user:password@]host:port[/db]     (rediss:// for TLS)
  unix://[user:password@]/path/redis.sock[?db=N]
  redis://host:port?addr=host:port&addr=...  (a Redis Cluster; the URL of
                                              any one node works too)`

// dialTimeout bounds how long the first contact with Redis may take.
const dialTimeout = 3 * time.Second

// badRedisURLError is a Redis URL that does not parse.
type badRedisURLError struct {
	from, url string
	err       error
}

func (e *badRedisURLError) Error() string {
	return fmt.Sprintf("%s %q is not a Redis URL: %v\n%s", e.from, redactURL(e.url), e.err, acceptedRedisURLs)
}

func (e *badRedisURLError) Unwrap() error { return e.err }

// isClusterURL reports whether raw is go-redis's cluster URL form: one node
// in the authority, the others as addr query parameters.
func isClusterURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Query().Has("addr")
}

// checkRedisURL reports a URL that dialRedis would refuse to parse; from
// names where it came from ("-redis", "REDIS_URL").
func checkRedisURL(raw, from string) error {
	var err error
	if isClusterURL(raw) {
		_, err = redis.ParseClusterURL(raw)
	} else {
		_, err = redis.ParseURL(raw)
	}
	if err != nil {
		return &badRedisURLError{from: from, url: raw, err: err}
	}
	return nil
}

// dialRedis connects to the Redis at raw and checks that it answers. A
// cluster URL (isClusterURL) gives a *redis.ClusterClient; so does the URL
// of a node of a Redis Cluster (INFO cluster says cluster_enabled:1), so
// that every key reaches its slot's node. The description names what it
// connected to, without the password.
func dialRedis(ctx context.Context, raw, from string) (redis.UniversalClient, string, error) {
	if err := checkRedisURL(raw, from); err != nil {
		return nil, "", err
	}
	where := redactURL(raw)
	if isClusterURL(raw) {
		opt, _ := redis.ParseClusterURL(raw)
		opt.ContextTimeoutEnabled = true
		cc := redis.NewClusterClient(opt)
		if err := pingCluster(ctx, cc); err != nil {
			_ = cc.Close()
			return nil, "", fmt.Errorf("cannot reach the Redis Cluster at %s (%s): %w", where, from, err)
		}
		return cc, "Redis Cluster " + where, nil
	}
	opt, _ := redis.ParseURL(raw)
	opt.ContextTimeoutEnabled = true
	rdb := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, "", fmt.Errorf("cannot reach Redis at %s (%s): %w", where, from, err)
	}
	// miniredis and old servers may not know INFO cluster: not a cluster.
	info, err := rdb.Info(pctx, "cluster").Result()
	if err != nil || !strings.Contains(info, "cluster_enabled:1") {
		return rdb, "Redis " + where, nil
	}
	_ = rdb.Close()
	if opt.DB != 0 {
		return nil, "", fmt.Errorf("%s %s is a node of a Redis Cluster, which has only database 0: drop /%d from the URL", from, where, opt.DB)
	}
	cc := redis.NewClusterClient(clusterOptions(opt))
	if err := pingCluster(ctx, cc); err != nil {
		_ = cc.Close()
		return nil, "", fmt.Errorf("cannot reach the Redis Cluster of node %s (%s): %w", where, from, err)
	}
	return cc, "Redis Cluster of node " + where, nil
}

// clusterOptions turns the options of one cluster node into the options of
// a client of its whole cluster.
func clusterOptions(o *redis.Options) *redis.ClusterOptions {
	return &redis.ClusterOptions{
		Addrs:                 []string{o.Addr},
		ClientName:            o.ClientName,
		Protocol:              o.Protocol,
		Username:              o.Username,
		Password:              o.Password,
		MaxRetries:            o.MaxRetries,
		MinRetryBackoff:       o.MinRetryBackoff,
		MaxRetryBackoff:       o.MaxRetryBackoff,
		DialTimeout:           o.DialTimeout,
		ReadTimeout:           o.ReadTimeout,
		WriteTimeout:          o.WriteTimeout,
		ContextTimeoutEnabled: o.ContextTimeoutEnabled,
		PoolSize:              o.PoolSize,
		MinIdleConns:          o.MinIdleConns,
		MaxIdleConns:          o.MaxIdleConns,
		ConnMaxIdleTime:       o.ConnMaxIdleTime,
		ConnMaxLifetime:       o.ConnMaxLifetime,
		TLSConfig:             o.TLSConfig,
	}
}

// pingCluster pings every master of the cluster.
func pingCluster(ctx context.Context, cc *redis.ClusterClient) error {
	pctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	return cc.ForEachMaster(pctx, func(ctx context.Context, c *redis.Client) error {
		return c.Ping(ctx).Err()
	})
}

// scanKeys returns the keys matching pattern, from every master of a
// cluster.
func scanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	scan := func(ctx context.Context, c redis.Cmdable) ([]string, error) {
		var keys []string
		iter := c.Scan(ctx, 0, pattern, 100).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return keys, iter.Err()
	}
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, rdb)
	}
	var (
		mu   sync.Mutex
		keys []string
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		k, err := scan(ctx, c)
		mu.Lock()
		keys = append(keys, k...)
		mu.Unlock()
		return err
	})
	return keys, err
}

// deleteKeys deletes keys one command each, so that keys of different
// cluster slots can go in one pipeline.
func deleteKeys(ctx context.Context, rdb redis.UniversalClient, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Del(ctx, k)
		}
		return nil
	})
	return err
}

// redactURL is raw without its password, for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// errRedisLost reports that Redis stopped answering in the middle of a run.
var errRedisLost = errors.New("lost Redis mid-run")
