package cmdutil

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/kvctl/kvctl/mooncake"
)

// briefError prints a short message and keeps the whole chain for errors.Is and errors.As.
type briefError struct {
	msg string
	err error
}

func (e *briefError) Error() string { return e.msg }
func (e *briefError) Unwrap() error { return e.err }

// Briefly returns err under the message prefix + ": " + its root cause, said once: a failed
// HTTP call reads "dial tcp 127.0.0.1:1: connect: connection refused" rather than the URL and
// "unreachable" repeated by every layer, and a web server that is not a pool reads as such
// instead of its HTML page. errors.Is and errors.As still see err.
func Briefly(prefix string, err error) error {
	if err == nil {
		return nil
	}
	return &briefError{msg: prefix + ": " + RootCause(err), err: err}
}

// RootCause says in a few words what went wrong at the bottom of err.
func RootCause(err error) string {
	var se *mooncake.StatusError
	if errors.As(err, &se) {
		if looksHTML(se.Message) {
			return fmt.Sprintf("HTTP %d with an HTML page: this address is not a Mooncake master or a kvctl serve admin API", se.StatusCode)
		}
		msg := fmt.Sprintf("HTTP %d", se.StatusCode)
		if se.Code != 0 {
			msg += fmt.Sprintf(" (error_code %d)", se.Code)
		}
		if se.Message != "" {
			msg += ": " + firstLine(se.Message, 200)
		}
		return msg
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		return ue.Err.Error()
	}
	return err.Error()
}

func looksHTML(s string) bool {
	s = strings.ToLower(strings.TrimSpace(s))
	return strings.HasPrefix(s, "<!doctype html") || strings.HasPrefix(s, "<html") || strings.Contains(s, "<head>") || strings.Contains(s, "<body")
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
