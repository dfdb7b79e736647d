//go:build !(cgo && linux)

package gpu

// Discover reports no GPU: NVML discovery needs a cgo build on Linux.
func Discover() (Inventory, error) {
	return Inventory{GPUs: []Device{}, NoGPUReason: "GPU support not built (needs cgo on Linux)"}, nil
}
