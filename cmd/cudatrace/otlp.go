package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/otlp"
)

// otlpFlags are where and how the agent and `export --format otlp` send
// OpenTelemetry profiles (package otlp), named as OpenTelemetry's own
// exporters' settings are.
type otlpFlags struct {
	endpoint    string
	protocol    string
	insecure    bool
	caFile      string
	certFile    string
	keyFile     string
	headers     []string
	headersFile string
	timeout     time.Duration
	attrs       []string
}

func (f *otlpFlags) bind(fl *pflag.FlagSet) {
	fl.StringVar(&f.endpoint, "otlp-endpoint", "", "send OpenTelemetry profiles to this OTLP receiver (an OpenTelemetry Collector): host:port for gRPC, a URL for HTTP (/v1development/profiles added when it has no path)")
	fl.StringVar(&f.protocol, "otlp-protocol", otlp.GRPC, "OTLP transport: grpc or http/protobuf")
	fl.BoolVar(&f.insecure, "otlp-insecure", false, "send in plaintext (no TLS); an http:// endpoint does the same")
	fl.StringVar(&f.caFile, "otlp-ca-file", "", "PEM CA certificate(s) the receiver's certificate is checked against (default: the system's)")
	fl.StringVar(&f.certFile, "otlp-cert-file", "", "client certificate (PEM), for mutual TLS")
	fl.StringVar(&f.keyFile, "otlp-key-file", "", "client certificate's key (PEM)")
	fl.StringArrayVar(&f.headers, "otlp-header", nil, "NAME=VALUE sent with every request (repeatable); for a secret, --otlp-headers-file")
	fl.StringVar(&f.headersFile, "otlp-headers-file", "", "file of NAME=VALUE lines sent with every request (e.g. authorization=Bearer TOKEN), kept off the command line")
	fl.DurationVar(&f.timeout, "otlp-timeout", otlp.DefaultTimeout, "bound on one OTLP request")
	fl.StringArrayVar(&f.attrs, "otlp-resource-attr", nil, "KEY=VALUE resource attribute on every process's profiles (repeatable), e.g. k8s.cluster.name=prod; host.name is this host's, k8s.node.name $NODE_NAME's")
}

// options reads the flags into an exporter's options.
func (f *otlpFlags) options(stderr io.Writer) (otlp.Options, error) {
	o := otlp.Options{Endpoint: f.endpoint, Protocol: f.protocol, Insecure: f.insecure, CAFile: f.caFile,
		CertFile: f.certFile, KeyFile: f.keyFile, Timeout: f.timeout, Headers: map[string]string{}, Stderr: stderr}
	if o.Protocol != otlp.GRPC && o.Protocol != otlp.HTTP {
		return o, hint.Wrap(fmt.Errorf("--otlp-protocol %q", f.protocol), "grpc or http/protobuf")
	}
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return o, hint.Wrap(fmt.Errorf("--otlp-header %q: want NAME=VALUE", h), "e.g. --otlp-header X-Scope-OrgID=tenant-a")
		}
		o.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	if f.headersFile != "" {
		fh, err := os.Open(f.headersFile)
		if err != nil {
			return o, hint.Wrap(fmt.Errorf("--otlp-headers-file: %w", err), "one NAME=VALUE a line")
		}
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			if !ok || strings.TrimSpace(k) == "" {
				return o, hint.Wrap(fmt.Errorf("--otlp-headers-file %s:%d: want NAME=VALUE", f.headersFile, n), "e.g. authorization=Bearer TOKEN")
			}
			o.Headers[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		if err := sc.Err(); err != nil {
			return o, fmt.Errorf("--otlp-headers-file: %w", err)
		}
	}
	return o, nil
}

// resource is the resource attributes every process's profiles carry:
// this host's name, the node's ($NODE_NAME, which the DaemonSet sets from
// the downward API), and --otlp-resource-attr's.
func (f *otlpFlags) resource() (map[string]string, error) {
	r := map[string]string{}
	if h, err := os.Hostname(); err == nil {
		r["host.name"] = h
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		r["k8s.node.name"] = n
		r["host.name"] = n // in a pod, the hostname is the pod's
	}
	for _, a := range f.attrs {
		k, v, ok := strings.Cut(a, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, hint.Wrap(fmt.Errorf("--otlp-resource-attr %q: want KEY=VALUE", a), "e.g. --otlp-resource-attr k8s.cluster.name=prod")
		}
		r[strings.TrimSpace(k)] = v
	}
	return r, nil
}

// exporter starts an exporter of the flags' options, its queue queue
// bytes ("" for the default).
func (f *otlpFlags) exporter(stderr io.Writer, queue string, retries time.Duration) (*otlp.Exporter, error) {
	o, err := f.options(stderr)
	if err != nil {
		return nil, err
	}
	o.MaxElapsed = retries
	if queue != "" {
		q, err := parseBytes(queue)
		if err != nil || q < 1<<10 || q > 1<<34 {
			if err == nil {
				err = fmt.Errorf("must be between 1KiB and 16GiB")
			}
			return nil, hint.Wrap(fmt.Errorf("--otlp-queue-size %q: %w", queue, err), "e.g. --otlp-queue-size 64MiB")
		}
		o.QueueBytes = int64(q)
	}
	e, err := otlp.New(o)
	if err != nil {
		return nil, hint.Wrap(err, "e.g. --otlp-endpoint otel-collector:4317 (gRPC), or --otlp-protocol http/protobuf --otlp-endpoint http://otel-collector:4318")
	}
	return e, nil
}

// exportRetries bounds the retries of `export --format otlp`: someone
// waits for it.
const exportRetries = 15 * time.Second

// sendOTLP sends the trace's profile to --otlp-endpoint, with the
// exporter's retries, and says what was sent.
func sendOTLP(cmd *cobra.Command, f *otlpFlags, trace string, opts export.Options) error {
	pd, err := export.TraceOTLP(trace, opts, opts.OTLP)
	if err != nil {
		return err
	}
	e, err := f.exporter(cmd.ErrOrStderr(), "", exportRetries)
	if err != nil {
		return err
	}
	defer e.Close(context.Background())
	n := pd.SampleCount()
	if err := e.Export(cmd.Context(), pd); err != nil {
		return hint.Wrap(err, "is an OpenTelemetry Collector listening there, with a profiles pipeline (--feature-gates=service.profilesSupport)? docs/otlp.md")
	}
	cmd.PrintErrf("cudatrace: otlp: %d samples of %d processes sent to %s\n", n, pd.ResourceProfiles().Len(), f.endpoint)
	return nil
}
