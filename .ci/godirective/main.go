// Command godirective reads `go list -m -json all` on standard input and
// checks that the main module's go directive equals the highest go directive
// among the other modules of the graph: the oldest Go that the module and its
// dependencies really need. It exits 1, saying what to set, when they differ.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/version"
	"io"
	"os"
)

// module is the part of a `go list -m -json` object this check reads.
type module struct {
	Path      string
	Main      bool
	GoVersion string
}

func main() {
	msg, err := check(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go directive:", err)
		os.Exit(1)
	}
	fmt.Println(msg)
}

// check decodes the module stream and compares the main module's go
// directive with the highest one of the others.
func check(r io.Reader) (string, error) {
	var main, highest module
	dec := json.NewDecoder(r)
	for {
		var m module
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", fmt.Errorf("reading go list output: %w", err)
		}
		if m.Main {
			main = m
			continue
		}
		// Modules with no go directive (or whose go.mod was not read)
		// ask for nothing.
		if m.GoVersion == "" {
			continue
		}
		if !version.IsValid("go" + m.GoVersion) {
			return "", fmt.Errorf("module %s has an invalid go directive %q", m.Path, m.GoVersion)
		}
		if highest.Path == "" || version.Compare("go"+m.GoVersion, "go"+highest.GoVersion) > 0 {
			highest = m
		}
	}
	switch {
	case main.Path == "":
		return "", errors.New("no main module in the input")
	case highest.Path == "":
		return "", errors.New("no dependency declares a go version")
	case main.GoVersion != highest.GoVersion:
		return "", fmt.Errorf("go.mod says go %s, but the highest go directive in the module graph is %s (%s): run go mod edit -go=%s && go mod tidy",
			main.GoVersion, highest.GoVersion, highest.Path, highest.GoVersion)
	}
	return fmt.Sprintf("go directive %s = the highest in the module graph (%s)", main.GoVersion, highest.Path), nil
}
