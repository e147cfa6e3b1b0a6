package consulsource

import (
	"errors"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// ClientOptions say how to reach Consul's HTTP API. Each field left empty
// keeps what Consul's own environment variables say (CONSUL_HTTP_ADDR,
// CONSUL_HTTP_TOKEN, CONSUL_HTTP_SSL, CONSUL_CACERT, CONSUL_CLIENT_CERT,
// CONSUL_CLIENT_KEY, CONSUL_TLS_SERVER_NAME, ...), else Consul's default
// (http://127.0.0.1:8500, no token).
type ClientOptions struct {
	// Addr is host:port, or a URL whose scheme says http or https. TLS
	// settings below make a host:port https.
	Addr string
	// Token is the ACL token sent with every query.
	Token string
	// CAFile is the PEM file of the CA that signs the server's
	// certificate.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key, when
	// Consul verifies its clients (verify_incoming).
	CertFile, KeyFile string
	// TLSServerName is the name the server's certificate must hold,
	// when it is not the host of Addr (such as server.dc1.consul).
	TLSServerName string
}

// NewClient returns a Consul client configured by o over Consul's
// environment.
func NewClient(o ClientOptions) (*api.Client, error) {
	cfg := api.DefaultConfig()
	if o.Addr != "" {
		cfg.Address = o.Addr
	}
	if o.Token != "" {
		cfg.Token = o.Token
	}
	tls := &cfg.TLSConfig
	if o.CAFile != "" {
		tls.CAFile = o.CAFile
	}
	if o.CertFile != "" {
		tls.CertFile = o.CertFile
	}
	if o.KeyFile != "" {
		tls.KeyFile = o.KeyFile
	}
	if o.TLSServerName != "" {
		tls.Address = o.TLSServerName
	}
	if o.CAFile != "" || o.CertFile != "" || o.TLSServerName != "" {
		// TLS settings given: an address without a scheme means https.
		cfg.Scheme = "https"
	}
	if (tls.CertFile == "") != (tls.KeyFile == "") {
		return nil, errors.New("consul client: a client certificate needs its key and a key its certificate")
	}
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	return c, nil
}
