// Package cmdutil is the glue every kvctl subcommand shares: the Factory that hands commands
// their dependencies, IO streams with terminal and colour detection, the output printers for
// -o table|json|yaml, and the error kinds that map to kvctl's exit codes.
//
// Exit codes, fixed for scripts:
//
//	0    success
//	1    failure at run time, a file named on the command line that cannot be read included
//	     (OpenInput, and config files through boundedio)
//	2    usage error: a flag or its KVCTL_* variable that does not parse or is outside its
//	     bounds (CheckCount); a hint to --help is printed after the message
//	3    validation failed: a config or input file that was read and is invalid, a probe or
//	     replay check that did not hold
//	4    pool, engine or GPU unreachable
//	130  interrupted
package cmdutil
