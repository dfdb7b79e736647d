package disagg

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzContextAnswer fuzzes what a context server answers: checkContextResponse accepts only a
// JSON object with choices, and an accepted answer that leaves work for a generation server
// always yields a generation request that carries the context server's disaggregated_params
// with request_type generation_only and the proxy's request id, and leaves the client's
// request untouched.
func FuzzContextAnswer(f *testing.F) {
	f.Add([]byte(`{"id":"cmpl-1","choices":[{"index":0,"text":"a","finish_reason":"length","disaggregated_params":{"request_type":"context_only","first_gen_tokens":[42],"ctx_request_id":7,"encoded_opaque_state":"AAEC"}}],"prompt_token_ids":[1,2,3]}`), false)
	f.Add([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"not_finished","disaggregated_params":{"ctx_request_id":1}}],"prompt_token_ids":null}`), true)
	f.Add([]byte(`{"choices":[{"index":0,"text":"done","finish_reason":"stop"}]}`), false)
	f.Add([]byte(`{"choices":[{"finish_reason":"length"}]}`), false)
	f.Add([]byte(`{"choices":[null]}`), true)
	f.Add([]byte(`{"choices":[]}`), false)
	f.Add([]byte(`[1]`), false)
	f.Add([]byte(`null`), false)
	f.Fuzz(func(t *testing.T, raw []byte, chat bool) {
		out, err := checkContextResponse(raw)
		if err != nil {
			if out != nil {
				t.Fatal("an answer and an error")
			}
			return
		}
		var choices []json.RawMessage
		if json.Unmarshal(out["choices"], &choices) != nil || len(choices) == 0 {
			t.Fatalf("accepted %q without choices", raw)
		}
		if !needGen(out) {
			return
		}
		ep := EndpointCompletions
		if chat {
			ep = EndpointChat
		}
		client := body{"model": json.RawMessage(`"m"`), "prompt": json.RawMessage(`"hello"`), "max_tokens": json.RawMessage(`16`)}
		keep := client.clone()
		const id = int64(1)<<55 | 12345
		g, lerr := genRequest(ep, client, out, id)
		if lerr != nil {
			t.Fatalf("an accepted answer that needs a generation leg gives no generation request: %v", lerr)
		}
		if len(client) != len(keep) {
			t.Fatal("genRequest changed the client's request")
		}
		for k, v := range keep {
			if !bytes.Equal(client[k], v) {
				t.Fatalf("genRequest changed the client's %s", k)
			}
		}
		payload, err := json.Marshal(g)
		if err != nil {
			t.Fatalf("the generation request does not marshal: %v", err)
		}
		var back struct {
			DP struct {
				RequestType string `json:"request_type"`
				ID          int64  `json:"disagg_request_id"`
			} `json:"disaggregated_params"`
			Model string `json:"model"`
		}
		if err := json.Unmarshal(payload, &back); err != nil || back.DP.RequestType != "generation_only" || back.DP.ID != id || back.Model != "m" {
			t.Fatalf("generation request %s: %+v, %v", payload, back, err)
		}
	})
}

// FuzzStreamAnswer fuzzes the aggregation of a generation server's stream into one answer: no
// stream panics, a stream is accepted only when it ends with [DONE] or every choice it opened
// has finished, and what is accepted becomes one valid JSON answer with at most 128 choices
// whose text is what the chunks carried.
func FuzzStreamAnswer(f *testing.F) {
	f.Add([]byte("data: {\"id\":\"c\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"Hel\"}]}\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"lo\",\"finish_reason\":\"stop\"}],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n"), false)
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"r\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\",\"stop_reason\":null}]}\n\n"), true)
	f.Add([]byte("data: {\"choices\":[{\"index\":1,\"text\":\"x\"}]}\n\n"), false)
	f.Add([]byte("data: {\"choices\":[{\"index\":128,\"text\":\"x\"}]}\n\n"), false)
	f.Add([]byte("data: {\"object\":\"error\",\"message\":\"overloaded\",\"code\":503}\n\n"), false)
	f.Add([]byte("data: not json\n\n"), true)
	f.Add([]byte("data: [DONE]\n\n"), true)
	f.Fuzz(func(t *testing.T, stream []byte, chat bool) {
		sr := newSSEReader(bytes.NewReader(stream))
		_, first, err := sr.next()
		if err != nil {
			return
		}
		a := &streamAnswer{chat: chat, choices: map[int]*choiceAnswer{}}
		err = a.collect(sr, first)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("refusal without a reason: %#v", err)
			}
			return
		}
		if !bytes.Contains(stream, []byte("[DONE]")) && !a.finished() {
			t.Fatalf("accepted an unfinished stream without [DONE]: %q", stream)
		}
		if len(a.choices) > 128 || a.size > maxGenResponse {
			t.Fatalf("%d choices, %d bytes", len(a.choices), a.size)
		}
		raw := a.json()
		var ans struct {
			Object  string `json:"object"`
			Choices []struct {
				Index   int     `json:"index"`
				Text    *string `json:"text"`
				Message *struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(raw, &ans); err != nil {
			t.Fatalf("answer %s is not JSON: %v", raw, err)
		}
		if len(ans.Choices) != len(a.choices) {
			t.Fatalf("%d choices in the answer, %d collected", len(ans.Choices), len(a.choices))
		}
		for _, c := range ans.Choices {
			text := ""
			switch {
			case chat && c.Message != nil:
				text = c.Message.Content
			case !chat && c.Text != nil:
				text = *c.Text
			default:
				t.Fatalf("choice %d has no text in %s", c.Index, raw)
			}
			if text != a.choices[c.Index].text.String() {
				t.Fatalf("choice %d text %q, collected %q", c.Index, text, a.choices[c.Index].text.String())
			}
		}
	})
}
