// Package cmdutil is the glue every kvctl subcommand shares: the Factory that hands commands
// their dependencies, IO streams with terminal and colour detection, the output printers for
// -o table|json|yaml, and the error kinds that map to kvctl's exit codes.
//
// Exit codes, fixed for scripts:
//
//	0    success
//	1    failure at run time
//	2    usage error (the usage is printed after the message)
//	3    validation failed (invalid config, a probe or replay check that did not hold)
//	4    pool, engine or GPU unreachable
//	130  interrupted
package cmdutil
