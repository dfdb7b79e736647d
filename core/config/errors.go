package config

import "errors"

// Sentinel errors callers branch on.
var (
	// ErrUnknownKind: DetectKind could not tell what a file is, or a kind name is unknown.
	ErrUnknownKind = errors.New("unknown config kind")
	// ErrInvalid: a file has at least one error diagnostic.
	ErrInvalid = errors.New("invalid config")
	// ErrSize: a size value could not be parsed.
	ErrSize = errors.New("invalid size")
	// ErrNodeBudget: the segments and staging buffers claimed on a node exceed its memory budget.
	ErrNodeBudget = errors.New("node memory budget exceeded")
	// ErrMissingKeyInput: the files given do not name every input of the key derivation.
	ErrMissingKeyInput = errors.New("missing key input")
	// ErrRender: the client config cannot be rendered from the block and manifest given.
	ErrRender = errors.New("cannot render client config")
)
