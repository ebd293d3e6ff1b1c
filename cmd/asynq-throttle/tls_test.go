package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/asynq-throttle/asynq-throttle/internal/redistest"
)

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, each signed by the CA, as PEM files in dir.
func pki(t *testing.T, dir string) (ca, serverCert, serverKey, clientCert, clientKey string) {
	t.Helper()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	keyPEM := func(name string, k *ecdsa.PrivateKey) string {
		der, err := x509.MarshalECPrivateKey(k)
		require.NoError(t, err)
		return write(name, "EC PRIVATE KEY", der)
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
		require.NoError(t, err)
		return der, k
	}
	sDER, sKey := leaf(2, x509.ExtKeyUsageServerAuth)
	cDER, cKey := leaf(3, x509.ExtKeyUsageClientAuth)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", sDER), keyPEM("server-key.pem", sKey),
		write("client.pem", "CERTIFICATE", cDER), keyPEM("client-key.pem", cKey)
}

// --tls-ca, --tls-cert and --tls-key reach a Redis that serves TLS with a
// private CA and asks for client certificates, as redis-cli's --cacert,
// --cert and --key do (issue 35, item 10).
func TestTLSFlagsReachARedisWithAPrivateCAAndClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca, sCert, sKey, cCert, cKey := pki(t, dir)
	tlsAddr := redistest.ClosedAddr(t)
	_, tlsPort, _ := net.SplitHostPort(tlsAddr)
	redistest.Start(t, "--tls-port", tlsPort, "--tls-cert-file", sCert, "--tls-key-file", sKey,
		"--tls-ca-cert-file", ca, "--tls-auth-clients", "yes")
	flags := []string{"--tls-ca", ca, "--tls-cert", cCert, "--tls-key", cKey}

	for _, url := range []string{"rediss://" + tlsAddr, tlsAddr, "redis://" + tlsAddr + "/0"} {
		r := cli(t, "", append([]string{"--redis", url, "list"}, flags...)...)
		assert.Equal(t, exitOK, r.code, "%s: %s", url, r.stderr)
		assert.Contains(t, r.stdout, "no keys under prefix", url)
	}
	r := cli(t, "", "--redis", "rediss://"+tlsAddr, "--tls-ca", ca, "list")
	assert.Equal(t, exitFailed, r.code, "no client certificate: %s", r.stderr)
	assert.Contains(t, r.stderr, "cannot reach Redis")
	r = cli(t, "", "--redis", "rediss://"+tlsAddr, "list")
	assert.Equal(t, exitFailed, r.code, "no private CA: %s", r.stderr)

	for args, says := range map[string]string{
		"--tls-cert " + cCert:                      "--tls-cert needs --tls-key",
		"--tls-key " + cKey:                        "--tls-key needs --tls-cert",
		"--tls-ca " + filepath.Join(dir, "none"):   "--tls-ca: open",
		"--tls-ca " + cKey:                         "no PEM certificate in it",
		"--tls-cert " + cCert + " --tls-key " + ca: "--tls-cert",
	} {
		r := cli(t, "", append([]string{"--redis", tlsAddr, "list"}, strings.Fields(args)...)...)
		assert.Equal(t, exitUsage, r.code, "%s: %s", args, r.stderr)
		assert.Contains(t, r.stderr, says, args)
	}
}
