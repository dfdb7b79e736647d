// Package adversarial holds the attacks on `kvctl serve` that docs/SECURITY.md defends against,
// each run against a real `kvctl serve` process built from this tree: connection floods on each
// of its three listeners, planted socket directories, callers on another connection or under
// another uid, engines that name hashes they were never offered, memory that can shrink,
// oversized and malformed registrations and requests, lease loops on the admin API, descriptor
// floods, endless config files and a full pool.
//
// Every flood is bounded in count and duration, uses loopback or the test's own unix sockets
// only, and stops by itself. Attacks that need a second uid run when the tests run as root
// (they switch to nobody, uid 65534) and are skipped otherwise.
//
// The soak (TestSoak) runs only when KVCTL_SOAK names a duration; see docs/perf/security-soak.md.
package adversarial
