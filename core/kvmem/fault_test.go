package kvmem

import (
	"errors"
	"runtime/debug"
	"testing"
)

// TestRecoverFaultLeavesOtherPanics: without a panic the error and the fault setting are left
// as they were; a panic that is not a memory fault goes on past the guard. (Faults themselves
// are tested where memory is mapped: core/hostmem and core/engineapi truncate a mapped file.)
func TestRecoverFaultLeavesOtherPanics(t *testing.T) {
	errX := errors.New("x")
	quiet := func() (err error) {
		defer RecoverFault(&err, debug.SetPanicOnFault(true), errX)
		return nil
	}
	if err := quiet(); err != nil {
		t.Fatalf("no fault, error %v", err)
	}
	if debug.SetPanicOnFault(false) {
		t.Fatal("the guard left SetPanicOnFault on")
	}
	defer func() {
		if v := recover(); v != "not a fault" {
			t.Fatalf("recovered %v, want the panic to go on", v)
		}
	}()
	func() (err error) {
		defer RecoverFault(&err, debug.SetPanicOnFault(true), errX)
		panic("not a fault")
	}()
}
