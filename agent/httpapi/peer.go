package httpapi

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Who may read the agent without a token: the node's root and the agent's
// own user, on loopback. The agent serves command lines, stacks and memory
// layouts of every process on the node: another local user must not read
// them (docs/agent.md, Access). A loopback TCP client's socket is in this
// network namespace's socket table (/proc/self/net/tcp, tcp6) with its
// owner's UID, as identd reads it: the connection's two ends name it.

type peerKey struct{}

// peer is what ConnContext learns of a connection's other end.
type peer struct {
	uid int // -1: unknown (not loopback, or not found)
}

// ConnContext records who is at the other end of c: set it as the
// http.Server's ConnContext, or every client without a token is refused.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	p := &peer{uid: -1}
	local, lok := c.LocalAddr().(*net.TCPAddr)
	remote, rok := c.RemoteAddr().(*net.TCPAddr)
	if lok && rok && remote.IP.IsLoopback() {
		if uid, err := socketUID(remote, local); err == nil {
			p.uid = uid
		}
	}
	return context.WithValue(ctx, peerKey{}, p)
}

// trustedPeer says whether the request comes, over loopback, from root or
// from the agent's own user.
func trustedPeer(ctx context.Context) bool {
	p, _ := ctx.Value(peerKey{}).(*peer)
	return p != nil && p.uid >= 0 && (p.uid == 0 || p.uid == os.Geteuid())
}

// socketUID finds the TCP socket bound to local and connected to remote
// in this network namespace, and returns its owner's UID.
func socketUID(local, remote *net.TCPAddr) (int, error) {
	for _, table := range []string{"/proc/self/net/tcp", "/proc/self/net/tcp6"} {
		uid, err := scanTable(table, local, remote)
		if err == nil {
			return uid, nil
		}
		if !errors.Is(err, errNotFound) {
			return -1, err
		}
	}
	return -1, errNotFound
}

var errNotFound = errors.New("socket not found")

func scanTable(path string, local, remote *net.TCPAddr) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local rem st queues tr retrnsmt uid ...
		fs := strings.Fields(sc.Text())
		if len(fs) < 8 {
			continue
		}
		l, err1 := parseProcAddr(fs[1])
		r, err2 := parseProcAddr(fs[2])
		if err1 != nil || err2 != nil || !sameAddr(l, local) || !sameAddr(r, remote) {
			continue
		}
		uid, err := strconv.Atoi(fs[7])
		if err != nil {
			return -1, fmt.Errorf("%s: uid %q", path, fs[7])
		}
		return uid, nil
	}
	if err := sc.Err(); err != nil {
		return -1, err
	}
	return -1, errNotFound
}

func sameAddr(a, b *net.TCPAddr) bool { return a.Port == b.Port && a.IP.Equal(b.IP) }

// parseProcAddr reads /proc/net/tcp's ADDR:PORT: the address in hex, each
// 32-bit word in host (little-endian) order, the port in hex.
func parseProcAddr(s string) (*net.TCPAddr, error) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("address %q", s)
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b)%4 != 0 || (len(b) != 4 && len(b) != 16) {
		return nil, fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return nil, fmt.Errorf("port %q", s)
	}
	return &net.TCPAddr{IP: net.IP(b), Port: int(port)}, nil
}
