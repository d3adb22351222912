package badgerstore

import (
	"os"

	"golang.org/x/sys/unix"
)

// syncData is fdatasync(2): the file's data and the metadata needed to
// read it back, not its times.
func syncData(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if serr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
