package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// aggregatable reports whether a non-streamed request's answer can be rebuilt from a stream
// of its chunks: one choice, no log probabilities and no tool calls, whose chunks carry only
// text. Others keep a non-streamed leg bounded by request_timeout_s.
func aggregatable(b body) bool {
	var n int
	if json.Unmarshal(b["n"], &n) == nil && n > 1 {
		return false
	}
	if json.Unmarshal(b["best_of"], &n) == nil && n > 1 {
		return false
	}
	for _, k := range []string{"logprobs", "top_logprobs", "tools", "functions", "prompt_logprobs", "use_beam_search", "echo"} {
		if v, ok := b[k]; ok && !bytes.Equal(v, []byte("null")) && !bytes.Equal(v, []byte("false")) && !bytes.Equal(v, []byte("[]")) {
			return false
		}
	}
	return true
}

// streamAnswer rebuilds a non-streamed completion or chat answer from its stream's chunks.
type streamAnswer struct {
	chat    bool
	id      json.RawMessage
	created json.RawMessage
	model   json.RawMessage
	usage   json.RawMessage
	choices map[int]*choiceAnswer
	size    int
}

type choiceAnswer struct {
	text, reasoning strings.Builder
	role            string
	finish, stop    json.RawMessage
}

var errStreamGarbled = errors.New("a chunk of the stream is not a completion chunk")

// add folds one chunk's data in.
func (a *streamAnswer) add(data []byte) error {
	var c struct {
		ID      json.RawMessage `json:"id"`
		Created json.RawMessage `json:"created"`
		Model   json.RawMessage `json:"model"`
		Usage   json.RawMessage `json:"usage"`
		Choices []struct {
			Index        int             `json:"index"`
			Text         *string         `json:"text"`
			FinishReason json.RawMessage `json:"finish_reason"`
			StopReason   json.RawMessage `json:"stop_reason"`
			Delta        *struct {
				Role             string  `json:"role"`
				Content          *string `json:"content"`
				ReasoningContent *string `json:"reasoning_content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return fmt.Errorf("%w: %w", errStreamGarbled, err)
	}
	if a.id == nil {
		a.id, a.created, a.model = c.ID, c.Created, c.Model
	}
	if len(c.Usage) > 0 && !bytes.Equal(c.Usage, []byte("null")) {
		a.usage = c.Usage
	}
	for _, ch := range c.Choices {
		if ch.Index < 0 || ch.Index > 127 {
			return fmt.Errorf("%w: choice index %d", errStreamGarbled, ch.Index)
		}
		ca := a.choices[ch.Index]
		if ca == nil {
			ca = &choiceAnswer{}
			a.choices[ch.Index] = ca
		}
		if ch.Text != nil {
			ca.text.WriteString(*ch.Text)
			a.size += len(*ch.Text)
		}
		if d := ch.Delta; d != nil {
			if d.Role != "" {
				ca.role = d.Role
			}
			if d.Content != nil {
				ca.text.WriteString(*d.Content)
				a.size += len(*d.Content)
			}
			if d.ReasoningContent != nil {
				ca.reasoning.WriteString(*d.ReasoningContent)
				a.size += len(*d.ReasoningContent)
			}
		}
		if len(ch.FinishReason) > 0 && !bytes.Equal(ch.FinishReason, []byte("null")) {
			ca.finish = ch.FinishReason
		}
		if len(ch.StopReason) > 0 && !bytes.Equal(ch.StopReason, []byte("null")) {
			ca.stop = ch.StopReason
		}
	}
	if a.size > maxGenResponse {
		return fmt.Errorf("%w: more than %d bytes", errTooLarge, maxGenResponse)
	}
	return nil
}

// finished reports whether every choice seen has a finish reason.
func (a *streamAnswer) finished() bool {
	if len(a.choices) == 0 {
		return false
	}
	for _, c := range a.choices {
		if c.finish == nil {
			return false
		}
	}
	return true
}

// json returns the non-streamed answer.
func (a *streamAnswer) json() []byte {
	null := json.RawMessage("null")
	or := func(v json.RawMessage) json.RawMessage {
		if len(v) == 0 {
			return null
		}
		return v
	}
	idx := make([]int, 0, len(a.choices))
	for i := range a.choices {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	choices := make([]map[string]any, 0, len(idx))
	for _, i := range idx {
		c := a.choices[i]
		ch := map[string]any{"index": i, "logprobs": nil, "finish_reason": or(c.finish)}
		if a.chat {
			role := c.role
			if role == "" {
				role = "assistant"
			}
			msg := map[string]any{"role": role, "content": c.text.String()}
			if c.reasoning.Len() > 0 {
				msg["reasoning_content"] = c.reasoning.String()
			}
			ch["message"] = msg
		} else {
			ch["text"] = c.text.String()
		}
		if c.stop != nil {
			ch["stop_reason"] = c.stop
		}
		choices = append(choices, ch)
	}
	obj := "text_completion"
	if a.chat {
		obj = "chat.completion"
	}
	return mustJSON(map[string]any{"id": or(a.id), "object": obj, "created": or(a.created), "model": or(a.model),
		"choices": choices, "usage": or(a.usage)})
}

// collect reads the rest of a stream whose first chunk (data) was read, until [DONE].
func (a *streamAnswer) collect(sr *sseReader, data []byte) error {
	for {
		if bytes.Equal(data, []byte("[DONE]")) {
			return nil
		}
		if status, msg, isErr := inStreamError(data); isErr {
			return &LegError{Status: status, Message: msg, Err: ErrUpstream}
		}
		if len(bytes.TrimSpace(data)) > 0 {
			if err := a.add(data); err != nil {
				return err
			}
		}
		var err error
		_, data, err = sr.next()
		if errors.Is(err, io.EOF) {
			if a.finished() {
				return nil
			}
			return errors.New("the stream ended before its last chunk")
		}
		if err != nil {
			return err
		}
	}
}
