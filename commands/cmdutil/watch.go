package cmdutil

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Watch is a --watch loop: a report every Every seconds until the context is done.
type Watch struct {
	IO *IOStreams
	// Every is the interval in seconds.
	Every int
	// Format is the output format (-o); reports off a terminal are separated as it needs.
	Format string
	// Target, when set, names what is watched in the terminal header.
	Target string
	// Iterations stops the loop after that many reports (0: until the context is done).
	Iterations int
	// Seams: Now stamps the headers and the failures; Sleep waits between two reports.
	Seams
}

// Run calls report once per interval and writes what it returns with render. On a terminal each
// report replaces the previous one under a header; otherwise reports follow one another,
// separated as the output format needs (JSON needs nothing, YAML a document marker). A report
// that fails with ExitUnreachable is said on standard error and asked again at the next
// interval (a watch outlives a pool restart); any other failure ends the loop.
func (w Watch) Run(ctx context.Context, report func(context.Context) (render func() error, err error)) error {
	sleep, now := w.Sleeper(), w.Clock()
	tty := w.IO.IsStdoutTTY()
	printed := 0
	for n := 1; ; n++ {
		render, err := report(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ee *ExitError
		switch {
		case err != nil && errors.As(err, &ee) && ee.Code == ExitUnreachable:
			fmt.Fprintf(w.IO.ErrOut, "%s: %v\n", now().Format(time.TimeOnly), err)
		case err != nil:
			return err
		}
		// A report that failed for some of its targets still prints what the others said
		// (and an error row for each failed one).
		if render != nil {
			if tty {
				fmt.Fprint(w.IO.Out, "\x1b[H\x1b[2J")
				if w.Target != "" {
					fmt.Fprintf(w.IO.Out, "every %ds: %s  %s\n\n", w.Every, w.Target, now().Format(time.DateTime))
				} else {
					fmt.Fprintf(w.IO.Out, "every %ds  %s\n\n", w.Every, now().Format(time.DateTime))
				}
			} else if printed > 0 {
				switch w.Format {
				case FormatYAML:
					fmt.Fprint(w.IO.Out, "---\n")
				case FormatJSON:
				default:
					fmt.Fprint(w.IO.Out, "\n")
				}
			}
			if err := render(); err != nil {
				return err
			}
			printed++
		}
		if w.Iterations > 0 && n >= w.Iterations {
			return nil
		}
		if err := sleep(ctx, time.Duration(w.Every)*time.Second); err != nil {
			return err
		}
	}
}
