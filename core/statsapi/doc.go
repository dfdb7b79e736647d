// Package statsapi holds the wire types of kvctl serve's GET /v1/stats: the JSON body the
// daemon (core/daemon) serves and its clients (core/probe, kvctl stats) read. Server and
// clients share these types so that neither copies the other's; the clients never import the
// server package.
//
// Field names and JSON tags are a compatibility contract: fields are added, never renamed.
//
// It may import only the standard library and core/stats, whose prefix-hole stats type
// (stats.HoleStats) is the one /v1/stats serves.
package statsapi
