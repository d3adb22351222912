package main

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		input   string
		wantErr string // empty: the check passes
	}{
		{
			name: "equal to the highest",
			input: `{"Path":"example.com/m","Main":true,"GoVersion":"1.26.0"}
				{"Path":"a.example/x","GoVersion":"1.25"}
				{"Path":"b.example/y","GoVersion":"1.26.0"}
				{"Path":"c.example/z"}`,
		},
		{
			name: "higher than needed",
			input: `{"Path":"example.com/m","Main":true,"GoVersion":"1.26.8"}
				{"Path":"b.example/y","GoVersion":"1.26.0"}`,
			wantErr: "go.mod says go 1.26.8, but the highest go directive in the module graph is 1.26.0 (b.example/y)",
		},
		{
			name: "lower than a dependency needs",
			input: `{"Path":"example.com/m","Main":true,"GoVersion":"1.25"}
				{"Path":"b.example/y","GoVersion":"1.26rc1"}`,
			wantErr: "highest go directive in the module graph is 1.26rc1",
		},
		{
			// go/version orders 1.26 < 1.26rc1 < 1.26.0, which sort -V does not.
			name: "release above language version and rc",
			input: `{"Path":"example.com/m","Main":true,"GoVersion":"1.26.0"}
				{"Path":"a.example/x","GoVersion":"1.26"}
				{"Path":"b.example/y","GoVersion":"1.26rc2"}
				{"Path":"c.example/z","GoVersion":"1.26.0"}`,
		},
		{
			name:    "invalid directive",
			input:   `{"Path":"example.com/m","Main":true,"GoVersion":"1.26.0"} {"Path":"a.example/x","GoVersion":"one"}`,
			wantErr: `module a.example/x has an invalid go directive "one"`,
		},
		{
			name:    "no main module",
			input:   `{"Path":"a.example/x","GoVersion":"1.26.0"}`,
			wantErr: "no main module",
		},
		{
			name:    "no dependency with a go directive",
			input:   `{"Path":"example.com/m","Main":true,"GoVersion":"1.26.0"} {"Path":"a.example/x"}`,
			wantErr: "no dependency declares a go version",
		},
		{
			name:    "not json",
			input:   `go: errors parsing go.mod`,
			wantErr: "reading go list output",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := check(strings.NewReader(tt.input))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				if !strings.HasPrefix(msg, "go directive 1.26.0 = ") {
					t.Errorf("got message %q", msg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
