package httpapi

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/agent"
)

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:2262":                         "127.0.0.1:8802",
		"0000000000000000FFFF00000100007F:0050": "127.0.0.1:80",
		"00000000000000000000000001000000:1F90": "[::1]:8080",
	} {
		a, err := parseProcAddr(in)
		if err != nil || a.String() != want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", in, a, err, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "01007F:2262", "zz00007F:2262", "0100007F:x"} {
		if _, err := parseProcAddr(bad); err == nil {
			t.Errorf("parseProcAddr(%q) accepted", bad)
		}
	}
}

// A loopback client of this process is this process's user.
func TestSocketUID(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	uid, err := socketUID(s.RemoteAddr().(*net.TCPAddr), s.LocalAddr().(*net.TCPAddr))
	if err != nil || uid != os.Geteuid() {
		t.Errorf("socketUID = %d, %v; want %d", uid, err, os.Geteuid())
	}
}

// Without a token, a client the server cannot place (no ConnContext: here
// as for a peer off loopback) is refused; the agent's own user is served.
// With one, the scheme is case-insensitive.
func TestAccess(t *testing.T) {
	a := agent.New(agent.Options{NoSymbolize: true})
	defer a.Close()
	unknown := httptest.NewServer(New(a, Options{}))
	defer unknown.Close()
	if code, body := fetch(t, unknown.URL+"/"); code != http.StatusForbidden {
		t.Errorf("unplaced client without a token: %d %q, want 403", code, body)
	}
	open := httptest.NewServer(New(a, Options{Open: true}))
	defer open.Close()
	if code, _ := fetch(t, open.URL+"/"); code != http.StatusOK {
		t.Errorf("Open: %d, want 200", code)
	}
	local := httptest.NewUnstartedServer(New(a, Options{}))
	local.Config.ConnContext = ConnContext
	local.Start()
	defer local.Close()
	if code, _ := fetch(t, local.URL+"/"); code != http.StatusOK {
		t.Errorf("the agent's own user over loopback: %d, want 200", code)
	}

	tok := httptest.NewServer(New(a, Options{Token: "s3cret"}))
	defer tok.Close()
	for h, want := range map[string]int{
		"Bearer s3cret":  200,
		"bearer s3cret":  200,
		"BEARER  s3cret": 200,
		"Bearer wrong":   401,
		"Basic s3cret":   401,
		"s3cret":         401,
		"":               401,
	} {
		if code, _ := fetch(t, tok.URL+"/", "Authorization", h); code != want {
			t.Errorf("Authorization %q: %d, want %d", h, code, want)
		}
	}
}
