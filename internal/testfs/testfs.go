// Package testfs gives tests a small filesystem of their own, to run code
// against a disk that fills up without filling the machine's.
//
// Small mounts a tmpfs of a given size: tmpfs allocates a file's pages when
// they are first written, as a disk filesystem allocates blocks, and a
// memory-mapped write that finds it full gets SIGBUS just as it would on
// ext4 or xfs, which is what the store's full-disk tests need. It needs no
// image file and no loop device, and one umount removes it. Mounting needs
// root (CAP_SYS_ADMIN); where that is missing the test is skipped. CI runs
// as root.
//
// FilesContaining and Unpack search and unpack on-disk fixtures (which
// files hold a marker; a store written by an earlier format).
package testfs
