package fdpass

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReceived(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := unix.Sendmsg(pair[0], []byte("x"), unix.UnixRights(int(r.Fd()), int(w.Fd())), nil, 0); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(2*4))
	_, oobn, _, _, err := unix.Recvmsg(pair[1], buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	fds := Received(oob[:oobn])
	if len(fds) != 2 {
		t.Fatalf("received %v, want 2 descriptors", fds)
	}
	// The second is the pipe's write end: what is written through it
	// comes out of the first's read end.
	unix.Write(fds[1], []byte("ok"))
	got := make([]byte, 2)
	if n, _ := unix.Read(int(r.Fd()), got); string(got[:n]) != "ok" {
		t.Fatalf("read %q through the received write end", got[:n])
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if got := Received([]byte{1, 2, 3}); got != nil {
		t.Fatalf("garbage control data gave %v", got)
	}
}
