package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/asynq-throttle/asynq-throttle/internal/keyspace"
	"github.com/asynq-throttle/asynq-throttle/throttle"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // the command ran and failed: Redis, a task not found, ...
	exitUsage   = 2 // the command line is wrong
	defaultURL  = "redis://127.0.0.1:6379/0"
	pingTimeout = 3 * time.Second
)

// usageError is a wrong command line: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// app is one run of the command: its flags, its writers and, once a
// command needs it, its Redis connection.
type app struct {
	getenv func(string) string
	stdin  io.Reader // read by delete's confirmation only
	stdout io.Writer
	stderr io.Writer

	redisURL string
	prefix   string
	output   string
	// tlsCA, tlsCert and tlsKey are files: a CA to trust, and a client
	// certificate and its key (--tls-ca, --tls-cert, --tls-key).
	tlsCA, tlsCert, tlsKey string

	rdb redis.UniversalClient
	lim *throttle.Limiter
	// maxSuspension caps suspend (the middleware's own cap applies to 429s).
	maxSuspension time.Duration
}

// run executes the command line args and returns the exit code. Errors go
// to stderr as one line.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr, maxSuspension: 24 * time.Hour}
	defer a.close()
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "asynq-throttle: %v\n", err)
	if isUsage(err) {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitFailed
}

func isUsage(err error) bool {
	var u usageError
	if errors.As(err, &u) || errors.Is(err, throttle.ErrInvalidKey) {
		return true
	}
	// cobra's own: unknown commands and a wrong number of arguments.
	msg := err.Error()
	for _, p := range []string{"unknown command", "accepts ", "requires at least", "unknown flag", "unknown shorthand"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "asynq-throttle",
		Short: "Operate asynq-throttle's fleet-wide limits in Redis",
		Long: `asynq-throttle shows and steers the limits that asynq-throttle's middleware
enforces: list the keys, change limits, suspend a provider, watch the buckets
live, explain why a task waits, and serve the web view with Prometheus metrics.

Redis: --redis URL, else $REDIS_URL, else ` + defaultURL + `.
  host:port, redis://[user:pass@]host:port[/db]   standalone (rediss:// for TLS, unix:///path.sock)
  redis+sentinel://host:26379[/db]?master_name=NAME[&addr=host2:26379]   Sentinel
  redis+cluster://host:port[?addr=host2:port2&addr=...]                 Cluster
  (rediss+sentinel://, rediss+cluster:// for TLS; query options as go-redis's ParseURL)

TLS: rediss:// URLs, or --tls-ca FILE (a private CA), --tls-cert FILE and
--tls-key FILE (a client certificate), as redis-cli's --cacert, --cert and
--key; any of them turns TLS on.

Exit codes: 0 success, 1 the command failed (Redis unreachable, task not
found, ...), 2 bad usage (unknown command or flag, bad argument).`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetFlagErrorFunc(negativeArgError(""))
	f := root.PersistentFlags()
	f.StringVar(&a.redisURL, "redis", "", "Redis URL (default $REDIS_URL, else "+defaultURL+")")
	f.StringVar(&a.prefix, "prefix", keyspace.DefaultPrefix, "prefix of the limiter's Redis keys (throttle.WithPrefix)")
	f.StringVarP(&a.output, "output", "o", "table", "output format: table or json")
	f.StringVar(&a.tlsCA, "tls-ca", "", "PEM file of the CA that signed Redis's certificate (as redis-cli --cacert); turns TLS on")
	f.StringVar(&a.tlsCert, "tls-cert", "", "PEM file of a client certificate for Redis (as redis-cli --cert; with --tls-key); turns TLS on")
	f.StringVar(&a.tlsKey, "tls-key", "", "PEM file of the client certificate's private key (as redis-cli --key)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if a.output != "table" && a.output != "json" {
			return usagef("--output %q: want table or json", a.output)
		}
		if a.prefix == "" || strings.ContainsAny(a.prefix, "{}") {
			return usagef("--prefix %q: must be non-empty, without '{' or '}'", a.prefix)
		}
		return nil
	}
	root.AddCommand(a.listCmd(), a.getCmd(), a.setCmd(), a.weightsCmd(), a.suspendCmd(), a.resumeCmd(),
		a.deleteCmd(), a.watchCmd(), a.whyCmd(), a.serveCmd())
	return root
}

// args checks the number of positional arguments with a usage error that
// shows the command's form.
func args(min, max int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usagef("%s: wrong number of arguments (%d); usage: %s", cmd.Name(), len(args), cmd.UseLine())
		}
		return nil
	}
}

// limiter connects to Redis (once) and returns the limiter on it. A Redis
// it cannot reach is one error, not a retry loop.
func (a *app) limiter(ctx context.Context) (*throttle.Limiter, error) {
	if a.lim != nil {
		return a.lim, nil
	}
	url, from := a.redisURL, "--redis"
	if url == "" {
		url, from = a.getenv("REDIS_URL"), "REDIS_URL"
	}
	if url == "" {
		url, from = defaultURL, "the default URL"
	}
	tlsConf, err := a.tlsConfig()
	if err != nil {
		return nil, usageError{err}
	}
	rdb, err := openRedis(url, tlsConf)
	if err != nil {
		return nil, usageError{fmt.Errorf("%s: %w", from, err)}
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("cannot reach Redis at %s (from %s): %v", redactURL(url), from, err)
	}
	a.rdb = rdb
	a.lim = throttle.NewLimiter(rdb, throttle.WithPrefix(a.prefix), throttle.WithMaxSuspension(a.maxSuspension))
	return a.lim, nil
}

// tlsConfig is the TLS the --tls-* flags ask for, nil without any.
func (a *app) tlsConfig() (*tls.Config, error) {
	if a.tlsCA == "" && a.tlsCert == "" && a.tlsKey == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if a.tlsCA != "" {
		pem, err := os.ReadFile(a.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", a.tlsCA)
		}
	}
	switch {
	case a.tlsCert != "" && a.tlsKey != "":
		cert, err := tls.LoadX509KeyPair(a.tlsCert, a.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert %s, --tls-key %s: %w", a.tlsCert, a.tlsKey, err)
		}
		c.Certificates = []tls.Certificate{cert}
	case a.tlsCert != "":
		return nil, fmt.Errorf("--tls-cert needs --tls-key: the certificate's private key")
	case a.tlsKey != "":
		return nil, fmt.Errorf("--tls-key needs --tls-cert: the certificate of that key")
	}
	return c, nil
}

func (a *app) close() {
	if a.rdb != nil {
		a.rdb.Close()
	}
}

func (a *app) json() bool { return a.output == "json" }
