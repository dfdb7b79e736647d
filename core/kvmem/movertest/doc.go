// Package movertest is the test suite every kvmem.Mover backend runs: the host backend in CI,
// the CUDA backend on a GPU host. A backend supplies engine memory it can read and write
// directly, so the suite checks what Gather and Scatter did independently of them.
//
// It is imported by test files only (core/hostmem's and gpu's), and imports core/kvmem and the
// standard library.
package movertest
