// Package boundedio reads files kvctl is handed (configs, traces, manifests) through a hard
// byte limit that does not trust what stat says, and so that the command's context interrupts a
// read that blocks.
//
// Vocabulary: a file's limit is the most bytes read from it; reading more fails with
// ErrTooLarge. A regular file, a FIFO, a pipe or a character device (/dev/zero) are all read the
// same way: through the limit. A FIFO is opened without waiting for a writer, and a read that
// waits for data returns as soon as the context is done (SIGINT or SIGTERM in the CLI).
package boundedio
