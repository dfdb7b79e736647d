//go:build !linux

package transfer

import "syscall"

// readvFull is Linux's; elsewhere readPieces reads piece by piece (ok false).
func readvFull(syscall.RawConn, [][]byte) (int, bool, error) { return 0, false, nil }
