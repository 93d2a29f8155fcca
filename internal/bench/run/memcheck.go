package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type memResult struct {
	lines []string // for the report
	pass  bool
}

// memChecks runs the two memory checks on fresh bare and idemproxy processes;
// the bare figures are the reference, the limits apply to idemproxy.
func (b *bench) memChecks(ctx context.Context) ([]memResult, error) {
	cfg := b.cfg
	up, err := b.startUpstream(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer up.p.stop()

	var big [2]bigFigures
	for i, kind := range []string{"bare", "idem"} {
		logf("memory: %d MiB response through %s", cfg.bigBytes>>20, kind)
		if big[i], err = b.bigCheck(ctx, up, kind); err != nil {
			return nil, fmt.Errorf("memory check (10 MiB response, %s): %w", kind, err)
		}
	}
	var slow [2]slowFigures
	for i, kind := range []string{"bare", "idem"} {
		logf("memory: %d concurrent slow requests through %s", cfg.slowN, kind)
		if slow[i], err = b.slowCheck(ctx, up, kind); err != nil {
			return nil, fmt.Errorf("memory check (slow requests, %s): %w", kind, err)
		}
	}

	bare, idem := big[0], big[1]
	limit := cfg.maxStored + cfg.memSlack
	growth := idem.peak - idem.base
	pass := growth <= limit && idem.got == cfg.bigBytes && idem.status/100 == 2
	retry := fmt.Sprintf("its retry %d, %d B, replayed %v", idem.retryStatus, idem.retryBytes, idem.retryReplayed)
	if cfg.idemBare {
		retry = "its retry not checked (-idem-bare)"
	}
	r1 := memResult{pass: pass, lines: []string{
		fmt.Sprintf("%d MiB answer, keyed, read at %.0f MiB/s: RSS %+.1f MiB [%+.1f]; limit %+.1f: %s",
			cfg.bigBytes>>20, idem.rateMiBs, mib(growth), mib(bare.peak-bare.base), mib(limit), passFail(pass)),
		fmt.Sprintf("  answered %d, %d B; %s", idem.status, idem.got, retry)}}

	sb, si := slow[0], slow[1]
	pass2 := si.peak < cfg.memLimit && si.ok == cfg.slowN
	r2 := memResult{pass: pass2, lines: []string{
		fmt.Sprintf("%d slow requests at once: peak RSS %.1f MiB [%.1f]; limit %d MiB: %s",
			cfg.slowN, mib(si.peak), mib(sb.peak), cfg.memLimit>>20, passFail(pass2)),
		fmt.Sprintf("  upstream holds each %v; answers %s; in flight at most %d; took %v",
			cfg.slow, si.statuses, si.inflightMax, si.took.Round(10*time.Millisecond))}}
	return []memResult{r1, r2}, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func passFail(ok bool) string {
	if ok {
		return "pass"
	}
	return "fail"
}

// rssSampler records the maximum VmRSS of pid every interval until stopped.
type rssSampler struct {
	stop chan struct{}
	done chan struct{}
	max  int64 // bytes
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if m, err := memKB(pid, "VmRSS"); err == nil && m["VmRSS"]<<10 > s.max {
				s.max = m["VmRSS"] << 10
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *rssSampler) end() int64 { close(s.stop); <-s.done; return s.max }

// settle warms a fresh proxy with a few keyed requests and returns its VmRSS
// and VmHWM in bytes.
func (b *bench) settle(ctx context.Context, t *target, tag string) (rss, hwm int64, err error) {
	for i := 0; i < 20; i++ {
		if _, err := b.post(ctx, t.url+"/v1/orders", fmt.Sprintf("%s-warm-%d", tag, i)); err != nil {
			return 0, 0, err
		}
	}
	select {
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(200 * time.Millisecond):
	}
	m, err := memKB(t.p.pid(), "VmRSS", "VmHWM")
	if err != nil {
		return 0, 0, err
	}
	return m["VmRSS"] << 10, m["VmHWM"] << 10, nil
}

type bigFigures struct {
	base, peak    int64 // bytes
	got           int64
	status        int
	rateMiBs      float64
	retryStatus   int
	retryBytes    int64
	retryReplayed bool
}

// bigCheck streams the upstream's big body through a fresh proxy with a key,
// reading it at a bounded rate, and reports the proxy's RSS growth.
func (b *bench) bigCheck(ctx context.Context, up *upstream, kind string) (bigFigures, error) {
	t, err := b.startTarget(ctx, kind, up, "")
	if err != nil {
		return bigFigures{}, err
	}
	defer t.p.stop()
	tag := fmt.Sprintf("%s-mem-big-%s", b.runID, kind)
	var f bigFigures
	var hwm0 int64
	if f.base, hwm0, err = b.settle(ctx, t, tag); err != nil {
		return f, err
	}
	smp := sampleRSS(t.p.pid(), 5*time.Millisecond)
	start := time.Now()
	f.status, f.got, err = b.readBig(ctx, t.url+"/big", tag+"-key")
	elapsed := time.Since(start)
	f.peak = smp.end()
	if err != nil {
		return f, err
	}
	if m, err := memKB(t.p.pid(), "VmHWM"); err == nil && m["VmHWM"]<<10 > hwm0 {
		f.peak = max(f.peak, m["VmHWM"]<<10)
	}
	f.rateMiBs = mib(f.got) / elapsed.Seconds()
	retry, err := b.post(ctx, t.url+"/big", tag+"-key")
	if err != nil {
		return f, err
	}
	f.retryStatus, f.retryBytes, f.retryReplayed = retry.status, retry.n, retry.replayed
	return f, nil
}

// readBig POSTs with key and reads the answer in 64 KiB steps with a 3 ms
// pause after each (about 20 MiB/s), so a proxy that reads ahead of its
// client would show it in its RSS.
func (b *bench) readBig(ctx context.Context, url, key string) (int, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(benchBody))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for i := 0; i < 100000; i++ {
		m, err := io.ReadFull(resp.Body, buf)
		n += int64(m)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return resp.StatusCode, n, err
		}
		select {
		case <-ctx.Done():
			return resp.StatusCode, n, ctx.Err()
		case <-time.After(3 * time.Millisecond):
		}
	}
	return resp.StatusCode, n, nil
}

type slowFigures struct {
	base, peak  int64 // bytes
	ok          int
	statuses    string
	inflightMax int64
	took        time.Duration
}

// slowCheck holds slowN concurrent requests, each with its own key and its
// own connection, on the upstream's slow endpoint through a fresh proxy.
func (b *bench) slowCheck(ctx context.Context, up *upstream, kind string) (slowFigures, error) {
	cfg := b.cfg
	t, err := b.startTarget(ctx, kind, up, "")
	if err != nil {
		return slowFigures{}, err
	}
	defer t.p.stop()
	tag := fmt.Sprintf("%s-mem-slow-%s", b.runID, kind)
	var f slowFigures
	var hwm0 int64
	if f.base, hwm0, err = b.settle(ctx, t, tag); err != nil {
		return f, err
	}
	if _, err := b.upstreamStats(up, true); err != nil {
		return f, err
	}
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true, MaxIdleConnsPerHost: -1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: cfg.slow + 30*time.Second}

	smp := sampleRSS(t.p.pid(), 50*time.Millisecond)
	start := time.Now()
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < cfg.slowN; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res := "error"
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/slow", strings.NewReader(benchBody))
			if err == nil {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", tag+"-"+strconv.Itoa(i))
				var resp *http.Response
				if resp, err = client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					res = strconv.Itoa(resp.StatusCode)
				}
			}
			mu.Lock()
			counts[res]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	f.took = time.Since(start)
	f.peak = smp.end()
	if ctx.Err() != nil {
		return f, ctx.Err()
	}
	if m, err := memKB(t.p.pid(), "VmHWM"); err == nil && m["VmHWM"]<<10 > hwm0 {
		f.peak = max(f.peak, m["VmHWM"]<<10)
	}
	st, err := b.upstreamStats(up, false)
	if err != nil {
		return f, err
	}
	f.inflightMax = st.inflightMax
	var parts []string
	for k, v := range counts {
		parts = append(parts, fmt.Sprintf("%d×%s", v, k))
		if len(k) == 3 && k[0] == '2' {
			f.ok += v
		}
	}
	sort.Strings(parts)
	f.statuses = strings.Join(parts, " ")
	return f, nil
}
