package daemon

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/keys"
)

// Tenant isolation against a malicious engine. A block hash is not a secret: any local user can
// list the pool's keys on the admin API, and the cache salt, LoRA id and multimodal digests are
// folded into the hash only when the scheduler computes it in Lookup. So the worker must not
// move pages for a hash the engine merely names: BindMeta only accepts pages of blocks that a
// BuildMeta of the same deployment offered, and a deployment is one scheduler rank plus the
// worker ranks of the same namespace, model, world size and uid.

// offerGenerations is how many BuildMeta results of a scheduler stay bindable: worker ranks bind
// the metadata of a step right after it is built, but may trail the scheduler by a few steps.
const offerGenerations = 8

// offers are the page hashes a scheduler's recent BuildMeta calls handed out.
type offers struct {
	mu   sync.Mutex
	gens [offerGenerations]map[keys.PageHash]struct{}
	next int
}

// record remembers every page of m as offered, dropping the oldest generation (whose map is
// reused, so a steady stream of steps does not allocate).
func (o *offers) record(m connector.Metadata) {
	o.mu.Lock()
	defer o.mu.Unlock()
	gen := o.gens[o.next]
	if gen == nil {
		gen = make(map[keys.PageHash]struct{})
		o.gens[o.next] = gen
	}
	clear(gen)
	for _, set := range [][]connector.RequestTransfers{m.Loads, m.Saves, m.AsyncLoads} {
		for _, t := range set {
			for _, p := range t.Pages {
				gen[p.Hash] = struct{}{}
			}
		}
	}
	o.next = (o.next + 1) % offerGenerations
}

// hasLocked looks h up from the newest generation back (a step binds what was just built).
func (o *offers) hasLocked(h keys.PageHash) bool {
	for i := 1; i <= offerGenerations; i++ {
		if _, ok := o.gens[(o.next-i+offerGenerations)%offerGenerations][h]; ok {
			return true
		}
	}
	return false
}

// deployment is what engines must share for one's offers to be another's: namespace, model key,
// world size and the uid that registered them.
type deployment struct {
	namespace, model string
	world            int
	uid              int
}

// checkOffered refuses metadata naming a page of a block that no scheduler of e's deployment
// offered recently: an engine cannot load (or overwrite) a block by a hash it learned elsewhere.
func (d *Daemon) checkOffered(e *engine, m connector.Metadata) error {
	var sources []*offers
	if e.scheduler != nil {
		sources = []*offers{e.offers}
	} else {
		d.mu.RLock()
		for _, o := range d.engines {
			if o.scheduler != nil && o.deploy == e.deploy {
				sources = append(sources, o.offers)
			}
		}
		d.mu.RUnlock()
	}
	sets := []struct {
		kind string
		ts   []connector.RequestTransfers
	}{{"load", m.Loads}, {"save", m.Saves}, {"async load", m.AsyncLoads}}
	n := 0
	for _, set := range sets {
		for _, t := range set.ts {
			n += len(t.Pages)
		}
	}
	// One source's lock at a time (never two at once, so no lock order to get wrong); a page is
	// offered when any source has it.
	found := make([]bool, n)
	for _, src := range sources {
		src.mu.Lock()
		i := 0
		for _, set := range sets {
			for _, t := range set.ts {
				for _, p := range t.Pages {
					if !found[i] {
						found[i] = src.hasLocked(p.Hash)
					}
					i++
				}
			}
		}
		src.mu.Unlock()
	}
	i := 0
	for _, set := range sets {
		for _, t := range set.ts {
			for _, p := range t.Pages {
				if !found[i] {
					return fmt.Errorf("request %.64q: %s of block %s was not offered by a BuildMeta of this deployment; pages move only for blocks the scheduler matched or scheduled under the request's own scope", t.RequestID, set.kind, p.Hash)
				}
				i++
			}
		}
	}
	return nil
}

// peerCreds is gRPC transport credentials that do no handshake (the socket is local) but read
// the peer's SO_PEERCRED, so that calls know the uid of the process that made them.
type peerCreds struct{}

// peerAuth is the AuthInfo of an engine connection.
type peerAuth struct {
	credentials.CommonAuthInfo
	uid, pid int
}

func (peerAuth) AuthType() string { return "unix-peercred" }

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerAuth{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, uid: -1}, nil
}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	a := peerAuth{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, uid: -1}
	if cred, err := peerCred(c); err == nil {
		a.uid, a.pid = int(cred.Uid), int(cred.Pid)
	}
	return c, a, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }

// uidOf returns the uid of the process a call came from, or -1 when unknown.
func uidOf(ctx context.Context) int {
	if p, ok := peer.FromContext(ctx); ok {
		if a, ok := p.AuthInfo.(peerAuth); ok {
			return a.uid
		}
	}
	return -1
}
