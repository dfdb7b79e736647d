package cluster

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"strings"
)

// Exposure is an address the mooncake backend's unauthenticated traffic uses that is not on a
// private network: the Transfer Engine server on the host address (reads and writes of the
// whole segment for anyone who reaches it), the HTTP metadata server (PUTs of any segment
// descriptor) or the master's RPC port (mounts and placements).
type Exposure struct {
	// What names the traffic and the flag that set it.
	What string
	// Addr is the address as configured; IP the non-private address it is or resolves to.
	Addr string
	IP   netip.Addr
}

// cgnat is the shared address space (RFC 6598), private to a carrier or a cluster network.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// PrivateAddr reports whether ip is on a network that is not routed from the internet:
// loopback, RFC 1918 and RFC 4193 (unique local) addresses, link-local and the shared address
// space. The unspecified address (every interface) is not private.
func PrivateAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || cgnat.Contains(ip)
}

// Resolver resolves a host name to its addresses (net.DefaultResolver.LookupNetIP's shape).
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// CheckExposure returns the addresses among the host address, the metadata server URL and the
// master's RPC address that are (or resolve to) non-private addresses. A name that does not
// resolve is skipped: the mount reports it. resolve nil uses the system resolver.
func CheckExposure(ctx context.Context, hostAddress, metadataURL, master string, resolve Resolver) []Exposure {
	if resolve == nil {
		resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	var out []Exposure
	check := func(what, addr, host string) {
		if host == "" {
			return
		}
		ips := []netip.Addr{}
		if ip, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
			ips = append(ips, ip)
		} else if got, err := resolve(ctx, host); err == nil {
			ips = got
		}
		for _, ip := range ips {
			if !PrivateAddr(ip) {
				out = append(out, Exposure{What: what, Addr: addr, IP: ip.Unmap()})
				return
			}
		}
	}
	check("Transfer Engine server (--host-address)", hostAddress, hostAddress)
	if u, err := url.Parse(metadataURL); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		check("HTTP metadata server (--metadata)", metadataURL, u.Hostname())
	}
	if host, _, err := net.SplitHostPort(master); err == nil {
		check("master RPC (--master)", master, host)
	}
	return out
}
