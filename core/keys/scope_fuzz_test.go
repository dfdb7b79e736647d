package keys

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// FuzzParseMultimodal fuzzes the --mm-hash reader. Every refusal names the digest; an accepted
// digest reads back the same from both of its written forms, 64 hex characters and eight
// comma-separated int32 chunks.
func FuzzParseMultimodal(f *testing.F) {
	for _, s := range []string{
		"-1,0,2147483647,-2147483648,5,6,7,8",
		" 1, 2 ,3,4,5,6,7,8 ",
		"ffffffff000000007fffffff8000000000000005000000060000000700000008",
		"FFFFFFFF000000007FFFFFFF8000000000000005000000060000000700000008",
		"1111111111111111111111111111111111111111111111111111111111111111",
		"1,2,3,4,5,6,7", "1,2,3,4,5,6,7,2147483648", "+1,2,3,4,5,6,7,8", "42", "", strings.Repeat("g", 64),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseMultimodal(s)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "multimodal digest ") {
				t.Fatalf("ParseMultimodal(%q): error %q does not name the digest", s, err)
			}
			return
		}
		if back, err := ParseMultimodal(hex.EncodeToString(d[:])); err != nil || back != d {
			t.Fatalf("%q: the hex form of %x reads back as %x, %v", s, d, back, err)
		}
		chunks := make([]string, 8)
		for i := range chunks {
			chunks[i] = strconv.Itoa(int(int32(binary.BigEndian.Uint32(d[4*i:]))))
		}
		if back, err := ParseMultimodal(strings.Join(chunks, ",")); err != nil || back != d {
			t.Fatalf("%q: the chunk form of %x reads back as %x, %v", s, d, back, err)
		}
	})
}
