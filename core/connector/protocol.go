package connector

import "fmt"

// recentFinishedCapacity bounds how many finished asynchronous loads a worker remembers to tell
// a repeated announcement from one that never had a load.
const recentFinishedCapacity = 1 << 14

// protocolState is what a worker remembers to recognise request ids an engine names against
// the protocol (seed commit 4: misreported ids are fail-stop). Its sizes are bounded by the
// bound pass and recentFinishedCapacity, whatever the engine sends.
type protocolState struct {
	batch      map[string]bool // requests of the bound pass: loads, saves, parked loads
	handedBack map[string]bool // requests handed back for a restart since the pass was bound
	finished   *recentSet      // requests whose asynchronous load GetFinished reported
}

func newProtocolState() protocolState {
	return protocolState{batch: map[string]bool{}, handedBack: map[string]bool{}, finished: newRecentSet(recentFinishedCapacity)}
}

func (p *protocolState) bind(meta Metadata) {
	clear(p.batch)
	clear(p.handedBack)
	for _, set := range [][]RequestTransfers{meta.Loads, meta.Saves, meta.AsyncLoads} {
		for _, t := range set {
			p.batch[t.RequestID] = true
		}
	}
	for _, id := range meta.EarlyLoads {
		p.batch[id] = true
	}
}

func (p *protocolState) handBack(ids []string) {
	for _, id := range ids {
		p.handedBack[id] = true
	}
}

// checkDrop refuses a save drop for a request the worker has no reason to expect one for.
func (p *protocolState) checkDrop(ids []string) error {
	for _, id := range ids {
		if !p.batch[id] && !p.handedBack[id] {
			return fmt.Errorf("%w: the engine dropped the saves of request %q, which is not in the bound pass and was not handed back for a restart", ErrMisreportedRequest, id)
		}
	}
	return nil
}

// recentSet is a set that forgets its oldest member past a capacity.
type recentSet struct {
	ring  []string
	head  int
	items map[string]int // id -> its ring slot + 1
}

func newRecentSet(capacity int) *recentSet {
	return &recentSet{ring: make([]string, capacity), items: map[string]int{}}
}

func (r *recentSet) has(id string) bool { return r.items[id] > 0 }

func (r *recentSet) add(id string) {
	if r.has(id) {
		return
	}
	if old := r.ring[r.head]; r.items[old] == r.head+1 {
		delete(r.items, old)
	}
	r.ring[r.head] = id
	r.items[id] = r.head + 1
	r.head = (r.head + 1) % len(r.ring)
}

func (r *recentSet) remove(id string) { delete(r.items, id) }

func (r *recentSet) len() int { return len(r.items) }
