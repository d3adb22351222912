package testfs

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSmallFillFree(t *testing.T) {
	const size = 8 << 20
	dir := Small(t, size)
	if got := Free(t, dir); got < size-(64<<10) || got > size {
		t.Fatalf("fresh %d-byte filesystem has %d bytes free", size, got)
	}
	const leave = 1 << 20
	free := Fill(t, dir, leave)
	got := Free(t, dir)
	if got > leave || got < leave-(64<<10) {
		t.Fatalf("after Fill(%d): %d bytes free", leave, got)
	}
	// The filesystem really is that small: a file bigger than what is
	// left cannot be written.
	err := os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2*leave), 0o600)
	if err == nil {
		t.Fatalf("wrote %d bytes with %d free", 2*leave, got)
	}
	os.Remove(filepath.Join(dir, "big"))
	free()
	free() // a second call is harmless
	if got := Free(t, dir); got < size-(64<<10) {
		t.Fatalf("after freeing the filler: %d bytes free", got)
	}
	// Asking to leave more than is free writes nothing.
	Fill(t, dir, 2*size)()
}
