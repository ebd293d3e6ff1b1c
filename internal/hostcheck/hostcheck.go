// Package hostcheck decides which Host headers an operator's HTTP endpoint
// (the web view, and the metrics asynq-throttle serve exposes beside it)
// answers: localhost, IP addresses and the names it was given, so that a
// page that rebinds its own name to the endpoint's address (DNS rebinding)
// can neither read nor act.
package hostcheck

import (
	"net"
	"net/netip"
	"strings"
)

// Hosts is a set of allowed host names besides localhost and IP addresses;
// the zero value allows those only.
type Hosts map[string]bool

// Add allows names: host names as a browser sends them, matched without
// case, a port or a final dot.
func (h *Hosts) Add(names ...string) {
	for _, n := range names {
		if n = Canonical(n); n != "" {
			if *h == nil {
				*h = Hosts{}
			}
			(*h)[n] = true
		}
	}
}

// Allowed reports whether a request's Host (host[:port]) names the
// endpoint: localhost, an IP address or a host of h. A DNS-rebinding page
// reaches the endpoint under its own name, never under an IP address (a
// browser does not resolve one) nor localhost (resolved by the browser or
// /etc/hosts). Names under .localhost are not allowed unless given: not
// every resolver keeps them off the network.
func (h Hosts) Allowed(hostport string) bool {
	n := Canonical(hostport)
	if n == "" {
		return false
	}
	if n == "localhost" || h[n] {
		return true
	}
	_, err := netip.ParseAddr(n)
	return err == nil
}

// Canonical is a host name as Allowed compares it: without port, IPv6
// brackets, case or a final dot.
func Canonical(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}
