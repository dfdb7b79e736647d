package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// Target kinds.
const (
	KindMaster = "mooncake-master"
	KindServe  = "kvctl-serve"
)

// DefaultTimeout bounds each HTTP request to a target.
const DefaultTimeout = 5 * time.Second

// batchKeys is the most keys one /batch_query_keys request carries: the master splits the
// query string itself and kvctl serve refuses more than 10000, and long URLs are refused by
// proxies well before either limit.
const batchKeys = 256

// Target is a pool's admin address with an HTTP client bounded by a timeout. It is safe for
// concurrent use.
type Target struct {
	Admin   *mooncake.AdminClient
	Timeout time.Duration
	hc      *http.Client
	kind    string
}

// NewTarget returns a target for addr ("http://host:port" or "host:port"). It dials nothing.
func NewTarget(addr string, timeout time.Duration) (*Target, error) {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	hc := &http.Client{Timeout: timeout}
	c, err := mooncake.NewAdminClient(addr, hc)
	if err != nil {
		return nil, err
	}
	return &Target{Admin: c, Timeout: timeout, hc: hc}, nil
}

// Addr is the target's base URL.
func (t *Target) Addr() string { return t.Admin.BaseURL() }

// Kind asks /v1/stats once and caches the answer: KindServe when it answers 200, KindMaster
// when it answers 404. Any other answer is an error; one that wraps mooncake.ErrUnreachable
// when nothing answered.
func (t *Target) Kind(ctx context.Context) (string, error) {
	if t.kind != "" {
		return t.kind, nil
	}
	body, status, err := t.get(ctx, "/v1/stats")
	if err != nil {
		return "", err
	}
	switch status {
	case http.StatusOK:
		var s statsapi.StatsJSON
		if err := json.Unmarshal(body, &s); err != nil {
			return "", fmt.Errorf("%s/v1/stats: %w: %w", t.Addr(), mooncake.ErrMalformedResponse, err)
		}
		t.kind = KindServe
	case http.StatusNotFound:
		t.kind = KindMaster
	default:
		return "", fmt.Errorf("%s/v1/stats: HTTP %d: not a Mooncake master or kvctl serve admin address", t.Addr(), status)
	}
	return t.kind, nil
}

// ServeStats fetches kvctl serve's /v1/stats.
func (t *Target) ServeStats(ctx context.Context) (statsapi.StatsJSON, error) {
	body, status, err := t.get(ctx, "/v1/stats")
	if err != nil {
		return statsapi.StatsJSON{}, err
	}
	if status != http.StatusOK {
		return statsapi.StatsJSON{}, fmt.Errorf("%s/v1/stats: HTTP %d", t.Addr(), status)
	}
	var s statsapi.StatsJSON
	if err := json.Unmarshal(body, &s); err != nil {
		return statsapi.StatsJSON{}, fmt.Errorf("%s/v1/stats: %w: %w", t.Addr(), mooncake.ErrMalformedResponse, err)
	}
	return s, nil
}

func (t *Target) get(ctx context.Context, path string) ([]byte, int, error) {
	u := t.Addr() + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := t.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, fmt.Errorf("%s: %w: %w", u, mooncake.ErrUnreachable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("%s: reading body: %w: %w", u, mooncake.ErrUnreachable, err)
	}
	return body, resp.StatusCode, nil
}

// Exists reports for each key whether the pool holds it. By default it asks
// /batch_query_keys, which is read-only; with renewLeases it asks /query_key key by key, which
// grants each present key a read lease as a connector's existence check does.
func (t *Target) Exists(ctx context.Context, keys []string, renewLeases bool) ([]bool, error) {
	out := make([]bool, len(keys))
	if renewLeases {
		for i, k := range keys {
			_, err := t.Admin.QueryKey(ctx, k)
			switch {
			case err == nil:
				out[i] = true
			case errors.Is(err, mooncake.ErrKeyNotFound):
			default:
				return nil, err
			}
		}
		return out, nil
	}
	for lo := 0; lo < len(keys); lo += batchKeys {
		hi := min(lo+batchKeys, len(keys))
		ans, err := t.Admin.BatchQueryKeys(ctx, keys[lo:hi])
		if err != nil {
			return nil, err
		}
		for i, k := range keys[lo:hi] {
			r, ok := ans[k]
			if !ok {
				return nil, fmt.Errorf("%s/batch_query_keys: %w: no answer for key %q", t.Addr(), mooncake.ErrMalformedResponse, k)
			}
			out[lo+i] = r.OK
		}
	}
	return out, nil
}
