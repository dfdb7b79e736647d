package disagg

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

var (
	// ErrBadRequest marks a client request the proxy cannot run (the client gets 400).
	ErrBadRequest = errors.New("bad request")
	// ErrTimeout marks a leg cancelled for time (the client gets 504).
	ErrTimeout = errors.New("timeout")
	// ErrUpstream marks a failure of an upstream server or the connection to it.
	ErrUpstream = errors.New("upstream failure")
)

// LegError is a failed leg: which server, the HTTP status the client gets and the message.
type LegError struct {
	Role    string // "context" or "generation"
	Server  string
	Status  int
	Message string
	Err     error // ErrTimeout, ErrUpstream or ErrBadRequest, possibly wrapping the cause
}

func (e *LegError) Error() string {
	if e.Server == "" {
		return e.Message
	}
	return fmt.Sprintf("%s server %s: %s", e.Role, e.Server, e.Message)
}

func (e *LegError) Unwrap() error { return e.Err }

// errorType is the OpenAI error type for a status.
func errorType(status int) string {
	switch {
	case status == http.StatusGatewayTimeout:
		return "timeout_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case status >= 400 && status < 500:
		return "invalid_request_error"
	}
	return "server_error"
}

// anthropicType is the Anthropic error type for a status.
func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	return "api_error"
}

type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// openAIErrorBody is the OpenAI error envelope, used for HTTP errors and in-stream errors.
func openAIErrorBody(status int, msg string) []byte {
	b, _ := json.Marshal(struct {
		Error openAIError `json:"error"`
	}{openAIError{Message: msg, Type: errorType(status), Code: status}})
	return b
}

// anthropicErrorBody is the Anthropic Messages error envelope.
func anthropicErrorBody(status int, msg string) []byte {
	type inner struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error inner  `json:"error"`
	}{"error", inner{anthropicType(status), msg}})
	return b
}

// maxErrorMessage bounds a worker's error text relayed to a client.
const maxErrorMessage = 2048

// workerMessage extracts the message of a worker's error body: OpenAI's error.message,
// trtllm-serve's flat message, FastAPI's detail, Anthropic's error.message, or the text itself.
func workerMessage(body []byte) string {
	var v struct {
		Message json.RawMessage `json:"message"`
		Detail  json.RawMessage `json:"detail"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(body, &v) == nil {
		var s string
		if json.Unmarshal(v.Message, &s) == nil && s != "" {
			return clip(s)
		}
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(v.Error, &e) == nil && e.Message != "" {
			return clip(e.Message)
		}
		if json.Unmarshal(v.Error, &s) == nil && s != "" {
			return clip(s)
		}
		if json.Unmarshal(v.Detail, &s) == nil && s != "" {
			return clip(s)
		}
		if len(v.Detail) > 0 {
			return clip(string(v.Detail))
		}
	}
	t := strings.TrimSpace(string(body))
	if t == "" {
		return "(empty body)"
	}
	return clip(t)
}

// inStreamError tells whether an SSE data payload is an error object, and its status and
// message.
func inStreamError(data []byte) (int, string, bool) {
	if len(data) == 0 || data[0] != '{' {
		return 0, "", false
	}
	var v struct {
		Type   string          `json:"type"`
		Object string          `json:"object"`
		Error  json.RawMessage `json:"error"`
		Code   json.RawMessage `json:"code"`
	}
	if json.Unmarshal(data, &v) != nil {
		return 0, "", false
	}
	if len(v.Error) == 0 && v.Object != "error" && v.Type != "error" {
		return 0, "", false
	}
	status := http.StatusInternalServerError
	var e struct {
		Code json.RawMessage `json:"code"`
	}
	code := v.Code
	if json.Unmarshal(v.Error, &e) == nil && len(e.Code) > 0 {
		code = e.Code
	}
	if n, err := strconv.Atoi(strings.Trim(string(code), "\"")); err == nil && n >= 400 && n <= 599 {
		status = n
	}
	return status, workerMessage(data), true
}

func clip(s string) string {
	if len(s) > maxErrorMessage {
		return s[:maxErrorMessage] + "…"
	}
	return s
}
