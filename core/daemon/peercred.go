package daemon

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// peerPolicy decides which local users may connect to the engine socket and the descriptor
// channel: the daemon's own uid, and the members of one group the operator names.
type peerPolicy struct {
	uid int
	gid int // -1: no group is admitted
	// memberOf reports whether uid is a member of gid (tests replace it).
	memberOf func(uid, gid int) bool
}

func newPeerPolicy(gid int) *peerPolicy {
	return &peerPolicy{uid: os.Geteuid(), gid: gid, memberOf: userInGroup}
}

// peerCred reads the credentials of the process at the other end of a unix connection.
func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc := unixConn(c)
	if uc == nil {
		return nil, fmt.Errorf("not a unix connection")
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", cerr)
	}
	return cred, nil
}

// check admits a connection from the daemon's uid or from a member of the operator's group.
func (p *peerPolicy) check(c net.Conn) error {
	cred, err := peerCred(c)
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if int(cred.Uid) == p.uid {
		return nil
	}
	if p.gid >= 0 && (int(cred.Gid) == p.gid || p.memberOf(int(cred.Uid), p.gid)) {
		return nil
	}
	if p.gid >= 0 {
		return fmt.Errorf("peer uid %d (pid %d) is neither the daemon's uid %d nor in group %d", cred.Uid, cred.Pid, p.uid, p.gid)
	}
	return fmt.Errorf("peer uid %d (pid %d) is not the daemon's uid %d (name a group with --engine-group to admit other users)", cred.Uid, cred.Pid, p.uid)
}

func userInGroup(uid, gid int) bool {
	u, err := user.LookupId(strconv.Itoa(uid))
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	if err != nil {
		return false
	}
	return slices.Contains(ids, strconv.Itoa(gid))
}

// LookupGroup resolves a group given by name or numeric id to its id.
func LookupGroup(name string) (int, error) {
	if id, err := strconv.Atoi(name); err == nil {
		if id < 0 {
			return 0, fmt.Errorf("group id %d is negative", id)
		}
		return id, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("engine group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}
