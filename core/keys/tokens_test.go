package keys

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in   string
		want []int64
	}{
		{"", []int64{}},
		{" \n\t", []int64{}},
		{"[]", []int64{}},
		{" [ ] \n", []int64{}},
		{"1 2 3", []int64{1, 2, 3}},
		{"1,2,3", []int64{1, 2, 3}},
		{"1, 2 ,3\n4\r\n5\t6 ,\n 7", []int64{1, 2, 3, 4, 5, 6, 7}},
		{"\xef\xbb\xbf1 2", []int64{1, 2}},
		{"-9223372036854775808 9223372036854775807 -1 0 -0 007", []int64{-1 << 63, 1<<63 - 1, -1, 0, 0, 7}},
		{"[1,2,3]", []int64{1, 2, 3}},
		{"[ -9223372036854775808 ,\n 9223372036854775807 ]\n", []int64{-1 << 63, 1<<63 - 1}},
		{"[9007199254740993]", []int64{9007199254740993}},
	}
	for _, tc := range tests {
		for _, mode := range []string{"whole", "one byte at a time"} {
			r := strings.NewReader(tc.in)
			var got []int64
			var err error
			if mode == "whole" {
				got, err = ParseTokens(r)
			} else {
				got, err = ParseTokens(iotest.OneByteReader(r))
			}
			if err != nil {
				t.Errorf("ParseTokens(%q) %s: %v", tc.in, mode, err)
				continue
			}
			if got == nil || len(got) != len(tc.want) {
				t.Errorf("ParseTokens(%q) %s = %v, want %v", tc.in, mode, got, tc.want)
				continue
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("ParseTokens(%q) %s = %v, want %v", tc.in, mode, got, tc.want)
					break
				}
			}
		}
	}
}

func TestParseTokensErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"1 2 3 9223372036854775808", "token 3: 9223372036854775808 is outside int64"},
		{"-9223372036854775809", "token 0: -9223372036854775809 is outside int64"},
		{"[1, 99999999999999999999999]", "token 1: 99999999999999999999999 is outside int64"},
		{"1 2.5", `token 1: "2.5" is not an integer`},
		{"[1e3]", `token 0: "1e3" is not an integer`},
		{"1 -", `token 1: "-" is not an integer`},
		{"1 +2", `token 1: "+2" is not an integer`},
		{"1 2-3", `token 1: "2-3" is not an integer`},
		{"abc", `token 0: "abc" is not an integer`},
		{`["1"]`, `token 0: "\"1\"" is not an integer`},
		{",1", "token 0: empty token before ','"},
		{"1,,2", "token 1: empty token before ','"},
		{"1, ,2", "token 1: empty token before ','"},
		{"1,2,", "token 2: empty token after trailing ','"},
		{"[1,]", "token 1: want a value after ',', got ']'"},
		{"[1,,2]", "token 1: want a value, got ','"},
		{"[,1]", "token 0: want a value, got ','"},
		{"[[1]]", "token 0: want a value, got '['"},
		{"[1 2]", "token 1: want ',' or ']' after the value, got '2'"},
		{"[1", "token 1: unexpected end of input, want ',' or ']'"},
		{"[1,", "token 1: unexpected end of input, want a value"},
		{"[", "token 0: unexpected end of input, want a value"},
		{"[1] 2", "token 1: unexpected '2' after the closing ']'"},
		{"[1]]", "token 1: unexpected ']' after the closing ']'"},
		{"1 " + strings.Repeat("9", 100), "token 1: " + strings.Repeat("9", 40) + "... (100 bytes) is outside int64"},
	}
	for _, tc := range tests {
		_, err := ParseTokens(strings.NewReader(tc.in))
		if err == nil || err.Error() != tc.want {
			t.Errorf("ParseTokens(%q): %v\nwant %s", tc.in, err, tc.want)
		}
		_, err2 := ParseTokens(iotest.OneByteReader(strings.NewReader(tc.in)))
		if err2 == nil || err2.Error() != tc.want {
			t.Errorf("ParseTokens(%q) one byte at a time: %v", tc.in, err2)
		}
	}
}

func TestParseTokensReadError(t *testing.T) {
	boom := errors.New("boom")
	_, err := ParseTokens(iotest.DataErrReader(iotest.ErrReader(boom)))
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "token 0: ") {
		t.Errorf("read error: %v", err)
	}
	r := iotest.TimeoutReader(iotest.OneByteReader(strings.NewReader("12 34")))
	_, err = ParseTokens(r)
	if !errors.Is(err, iotest.ErrTimeout) || !strings.HasPrefix(err.Error(), "token 1: ") {
		t.Errorf("read error after one token: %v", err)
	}
}

var errorPosition = regexp.MustCompile(`^token [0-9]+: `)

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"", "1 2 3", "[1,2,3]", "[-9223372036854775808, 9223372036854775807]", "1,,2", "[1,]",
		"9223372036854775808", "\xef\xbb\xbf[ ]", "1\n2\r\n3,4", "[[1]]", "-", "[1] x", "0x10"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseTokens(strings.NewReader(string(data)))
		got2, err2 := ParseTokens(iotest.OneByteReader(strings.NewReader(string(data))))
		if (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("chunked and byte-at-a-time reads disagree: %v / %v", err, err2)
		}
		if err != nil {
			if !errorPosition.MatchString(err.Error()) {
				t.Fatalf("error without a token position: %q", err)
			}
			return
		}
		if len(got) != len(got2) {
			t.Fatalf("chunked and byte-at-a-time reads disagree on the count")
		}
		// Whatever parsed must read back the same in both forms.
		var plain, js strings.Builder
		js.WriteByte('[')
		for i, v := range got {
			if got2[i] != v {
				t.Fatalf("token %d: %d and %d", i, v, got2[i])
			}
			if i > 0 {
				plain.WriteByte(' ')
				js.WriteByte(',')
			}
			plain.WriteString(strconv.FormatInt(v, 10))
			js.WriteString(strconv.FormatInt(v, 10))
		}
		js.WriteByte(']')
		for _, form := range []string{plain.String(), js.String()} {
			back, err := ParseTokens(strings.NewReader(form))
			if err != nil || len(back) != len(got) {
				t.Fatalf("re-reading %q: %v", form, err)
			}
			for i := range back {
				if back[i] != got[i] {
					t.Fatalf("re-reading %q: token %d is %d, want %d", form, i, back[i], got[i])
				}
			}
		}
	})
}
