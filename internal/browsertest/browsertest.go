// Package browsertest drives a real headless Chromium (Debian's chromium,
// which scripts/deps.sh installs) from tests, through the DevTools
// protocol (chromedp): it opens a page, waits for the page's script to say
// it is ready (window.cudatrace.ready), and collects every JavaScript
// error, every console error and every network request the page makes, so
// a test can assert that a page loads with none and fetches nothing. The
// browser runs with no network, no first-run, no background services and
// an empty profile of its own.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// Browser is one headless Chromium with one tab.
type Browser struct {
	ctx context.Context

	mu       sync.Mutex
	errors   []string // exceptions, console errors, error log entries
	requests []string // URLs requested
}

// Width and Height are the window's size, in CSS pixels.
const (
	Width  = 1400
	Height = 1000
)

// Start starts Chromium (skipping the test, or failing it under CI=true,
// where there is none); it ends with the test.
func Start(t testing.TB) *Browser {
	t.Helper()
	b, stop := start(t)
	t.Cleanup(stop)
	return b
}

var shared struct {
	sync.Mutex
	b    *Browser
	stop func()
}

// Shared returns the package's one Chromium, started by its first caller:
// tests that open pages one after the other need not each wait for a
// browser to start. Call Close from TestMain once the tests are done.
func Shared(t testing.TB) *Browser {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.b == nil {
		shared.b, shared.stop = start(t)
	}
	return shared.b
}

// Close ends the shared Chromium, if one was started.
func Close() {
	shared.Lock()
	defer shared.Unlock()
	if shared.stop != nil {
		shared.stop()
		shared.b, shared.stop = nil, nil
	}
}

// start starts Chromium, with its own empty profile; stop ends it.
func start(t testing.TB) (b *Browser, stop func()) {
	t.Helper()
	path := testenv.LookPath(t, "chromium")
	profile, err := os.MkdirTemp("", "cudatrace-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // root, in a VM: no user namespace sandbox
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(Width, Height),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	stop = func() {
		cancel()
		cancelAlloc()
		os.RemoveAll(profile)
	}
	b = &Browser{ctx: ctx}
	err = chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil && d.Exception.Description != "" {
				msg = d.Exception.Description
			}
			b.errors = append(b.errors, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
				var args []string
				for _, a := range ev.Args {
					args = append(args, strings.Trim(string(a.Value), `"`)+a.Description)
				}
				b.errors = append(b.errors, "console."+string(ev.Type)+": "+strings.Join(args, " "))
			}
		case *log.EventEntryAdded:
			if ev.Entry.Level == log.EntryLevelError {
				b.errors = append(b.errors, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		case *network.EventRequestWillBeSent:
			b.requests = append(b.requests, ev.Request.URL)
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	}
	if err == nil {
		_, err = chromedp.Call(ctx, log.Enable, cdp.Empty{})
	}
	if err == nil {
		_, err = chromedp.Call(ctx, runtime.Enable, cdp.Empty{})
	}
	if err != nil {
		stop()
		t.Fatalf("start chromium: %v", err)
	}
	return b, stop
}

// Open loads url and waits, up to timeout, for the page's script to be
// ready (window.cudatrace.ready) or to have shown a fatal error. It
// returns how long the page took to be ready.
func (b *Browser) Open(t testing.TB, url string, timeout time.Duration) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	b.mu.Lock()
	b.errors, b.requests = nil, nil // this page's alone
	b.mu.Unlock()
	start := time.Now()
	err := chromedp.Do(ctx, chromedp.Navigate(url))
	if err == nil {
		_, err = chromedp.Run(ctx, chromedp.Poll[chromedp.Void](
			`window.cudatrace && window.cudatrace.ready || !document.getElementById('fatal').hidden`,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	}
	took := time.Since(start)
	if err != nil {
		t.Fatalf("open %s: %v (JS errors: %q)", url, err, b.Errors())
	}
	var fatal string
	b.Eval(t, `document.getElementById('fatal').hidden ? '' : document.getElementById('fatal').textContent`, &fatal)
	if fatal != "" {
		t.Fatalf("open %s: %s", url, fatal)
	}
	return took
}

// Eval evaluates the JavaScript expression js in the page and decodes its
// value (JSON) into out (nil: dropped).
func (b *Browser) Eval(t testing.TB, js string, out any) {
	t.Helper()
	raw, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]byte](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("evaluate %s: %v: %s", js, err, raw)
		}
	}
}

// Wait waits, up to timeout, for the JavaScript expression js to be true.
func (b *Browser) Wait(t testing.TB, js string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout+time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(20*time.Millisecond),
		chromedp.WithPollingTimeout(timeout))); err != nil {
		t.Fatalf("wait for %s: %v", js, err)
	}
}

// Drag presses the mouse at (x0, y) on the page (CSS pixels from the
// viewport's top left), moves it to x1 and lets it go, as a user selects
// a range.
func (b *Browser) Drag(t testing.TB, x0, x1, y float64) {
	t.Helper()
	err := chromedp.Do(b.ctx,
		chromedp.MouseEvent(chromedp.MousePressed, x0, y, chromedp.ButtonLeft, chromedp.ClickCount(1)),
		chromedp.MouseEvent(chromedp.MouseMoved, (x0+x1)/2, y, chromedp.ButtonLeft),
		chromedp.MouseEvent(chromedp.MouseMoved, x1, y, chromedp.ButtonLeft),
		chromedp.MouseEvent(chromedp.MouseReleased, x1, y, chromedp.ButtonLeft, chromedp.ClickCount(1)))
	if err != nil {
		t.Fatalf("drag from %v to %v: %v", x0, x1, err)
	}
}

// Click clicks at (x, y) on the page.
func (b *Browser) Click(t testing.TB, x, y float64) {
	t.Helper()
	if err := chromedp.Do(b.ctx, chromedp.MouseClickXY(x, y)); err != nil {
		t.Fatalf("click at %v,%v: %v", x, y, err)
	}
}

// Type types text into the element sel (a CSS selector), as a user does.
func (b *Browser) Type(t testing.TB, sel, text string) {
	t.Helper()
	if err := chromedp.Do(b.ctx, chromedp.SendKeys(chromedp.CSS(sel), text)); err != nil {
		t.Fatalf("type into %s: %v", sel, err)
	}
}

// Screenshot writes a PNG of the element sel to path: "" the window as
// it shows (Width × Height), "*" the whole page.
func (b *Browser) Screenshot(t testing.TB, sel, path string) {
	t.Helper()
	var act chromedp.Action[[]byte]
	switch sel {
	case "":
		act = chromedp.CaptureScreenshot()
	case "*":
		act = chromedp.FullScreenshot(100)
	default:
		act = chromedp.Screenshot(chromedp.CSS(sel))
	}
	buf, err := chromedp.Run(b.ctx, act)
	if err != nil {
		t.Fatalf("screenshot %q: %v", sel, err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Errors returns the JavaScript errors seen so far.
func (b *Browser) Errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errors...)
}

// Requests returns the URLs the page requested so far.
func (b *Browser) Requests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.requests...)
}
