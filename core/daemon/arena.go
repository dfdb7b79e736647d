package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
)

// An engine's prompt arena (engineapi.PromptArena on its side) is mapped here read-only. It
// must be a memfd sealed with F_SEAL_SHRINK, like engine KV memory, so that the engine cannot
// truncate it under the mapping; lookups copy the range they name out of it (under the arena's
// read lock) before anything else reads the prompt, so an engine rewriting the arena meanwhile
// changes at most the answer to its own call. The arena goes with the engine rank: Unregister,
// the end of its connection, or a later RegisterPromptArena that replaces it.

// errArenaReleased is a lookup that raced its arena's release.
var errArenaReleased = errors.New("the prompt arena was released")

// promptArena is one engine rank's prompt arena as the daemon maps it.
type promptArena struct {
	mu   sync.RWMutex
	data []byte // nil once released
}

// mapPromptArena checks and maps size bytes of f read-only. limit bounds size.
func mapPromptArena(f *os.File, size, limit uint64) (*promptArena, error) {
	if size == 0 {
		return nil, errors.New("size is 0")
	}
	if size > limit {
		return nil, fmt.Errorf("size %d is above the limit of %d bytes", size, limit)
	}
	if err := checkSharedMemory(f, size); err != nil {
		return nil, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes read-only: %w", size, err)
	}
	return &promptArena{data: data}, nil
}

// tokens copies the range r names into dst; see engineapi.CopyArenaTokens.
func (a *promptArena) tokens(dst []int64, r *enginepb.ArenaRange, maxTokens int) ([]int64, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.data == nil {
		return dst[:0], errArenaReleased
	}
	return engineapi.CopyArenaTokens(dst, a.data, r.GetOffset(), r.GetCount(), maxTokens)
}

// release unmaps the arena once no lookup is copying out of it.
func (a *promptArena) release() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.data == nil {
		return nil
	}
	err := unix.Munmap(a.data)
	a.data = nil
	return err
}

// setArena installs a as e's prompt arena, releasing the one it replaces; an engine already
// closed releases a instead.
func (e *engine) setArena(a *promptArena) error {
	e.arenaMu.Lock()
	if e.arenaClosed {
		e.arenaMu.Unlock()
		_ = a.release()
		return status.Errorf(codes.FailedPrecondition, "register prompt arena: engine %q was unregistered", e.name)
	}
	old := e.arena
	e.arena = a
	e.arenaMu.Unlock()
	if old != nil {
		return old.release()
	}
	return nil
}

// promptArena returns e's prompt arena, nil when it has none.
func (e *engine) promptArena() *promptArena {
	e.arenaMu.Lock()
	defer e.arenaMu.Unlock()
	return e.arena
}

// closeArena releases e's prompt arena for good.
func (e *engine) closeArena() error {
	e.arenaMu.Lock()
	a := e.arena
	e.arena, e.arenaClosed = nil, true
	e.arenaMu.Unlock()
	if a != nil {
		return a.release()
	}
	return nil
}

func (s *service) RegisterPromptArena(ctx context.Context, req *enginepb.PromptArenaRequest) (*enginepb.Empty, error) {
	// Claimed first, so that a refused call does not leave the descriptor held until it expires.
	f, err := s.d.fds.Claim(req.GetFdToken())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register prompt arena: %v", err)
	}
	// The mapping keeps the memory; the descriptor is not needed past this call.
	defer f.Close()
	e, err := s.d.lookupEngine(ctx, req.GetEngine())
	if err != nil {
		return nil, err
	}
	if e.scheduler == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "register prompt arena: engine %q registered without the scheduler adapter (scheduler = false) and makes no lookups", e.name)
	}
	a, err := mapPromptArena(f, req.GetSize(), s.d.sec.limits.MaxPromptArenaBytes)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "register prompt arena: %v", err)
	}
	if err := e.setArena(a); err != nil {
		return nil, err
	}
	s.d.log.Debug("prompt arena registered", "engine", e.name, "bytes", req.GetSize())
	return &enginepb.Empty{}, nil
}

// arenaTokens reads the prompt pr names in tokens_arena out of engine name's arena into a new
// slice, which the lookup hands over to the scheduler (connector.Request.TokensOwned): the
// prompt is copied once, out of the arena, and not again into the scheduler's state.
func (d *Daemon) arenaTokens(ctx context.Context, name string, pr *enginepb.Request) (toks []int64, err error) {
	const call = "lookup"
	if len(pr.GetTokens()) > 0 || len(pr.GetTokensPacked()) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: tokens_arena and tokens or tokens_packed are all set; send the prompt in one of them", call)
	}
	e, err := d.lookupEngine(ctx, name)
	if err != nil {
		return nil, err
	}
	a := e.promptArena()
	if a == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: engine %q has no prompt arena: call RegisterPromptArena first, or send the prompt in tokens_packed", call, name)
	}
	r := pr.GetTokensArena()
	limit := min(d.sec.limits.MaxTokensPerRequest, engineapi.MaxRequestTokens)
	if r.GetCount() > uint64(limit) {
		return nil, limitError(call, "tokens_arena count", r.GetCount(), limit)
	}
	toks, err = a.tokens(nil, r, limit)
	if err != nil {
		if errors.Is(err, errArenaReleased) {
			return nil, status.Errorf(codes.FailedPrecondition, "%s: engine %q: %v", call, name, err)
		}
		return nil, status.Errorf(codes.InvalidArgument, "%s: %v", call, err)
	}
	return toks, nil
}
