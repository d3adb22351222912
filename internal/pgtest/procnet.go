package pgtest

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// localPortsOf returns the local ports of the established IPv4 TCP
// connections held by process pid, read from Linux's /proc: pid's socket
// inodes (/proc/pid/fd) matched against /proc/pid/net/tcp. For PgBouncer
// these are its server connections and its clients' connections; a
// PostgreSQL backend whose client_port is one of them serves the bouncer.
func localPortsOf(pid int) ([]int32, error) {
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
	if err != nil {
		return nil, err
	}
	inodes := make(map[string]bool)
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(target, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	if len(inodes) == 0 {
		return nil, fmt.Errorf("no sockets found in /proc/%d/fd (Linux's /proc is needed)", pid)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ports []int32
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "01" || !inodes[fields[9]] { // 01: ESTABLISHED
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/net/tcp: local address %q: %v", pid, fields[1], err)
		}
		ports = append(ports, int32(port))
	}
	return ports, sc.Err()
}
