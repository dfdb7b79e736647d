package kvmem

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// RecoverFault turns a memory fault during a copy to or from mapped memory (a shared file
// another process shrank under the mapping) into an error wrapping as, instead of the process
// dying. Use it as
//
//	defer kvmem.RecoverFault(&err, debug.SetPanicOnFault(true), ErrSomething)
//
// so that the goroutine panics on a fault for the copy's duration. It restores the previous
// SetPanicOnFault setting and recovers only the runtime's fault panics; any other panic goes on.
func RecoverFault(err *error, old bool, as error) {
	debug.SetPanicOnFault(old)
	v := recover()
	if v == nil {
		return
	}
	// A fault under SetPanicOnFault panics with a runtime.Error that also says where.
	if re, ok := v.(interface {
		runtime.Error
		Addr() uintptr
	}); ok {
		*err = fmt.Errorf("%w at address %#x: %w", as, re.Addr(), re)
		return
	}
	panic(v)
}
