// A real Go client consumer in a group (franz-go, kafka-go or sarama), reporting everything it receives in the JSON-line
// format of rig/group_consumer.py's Python runners, so the cooperative consumption tests and benches run it as
// one more client kind:
//
//	{"assigned": [[topic, partition], ...]}      after each rebalance (the client's own view; franz-go only)
//	{"paused": [...]}, {"resumed": [...]}        with -paused-until PATH (franz-go only): the topic is not fetched
//	                                             until the file PATH exists (a bench's backlog), as the Python runners
//	{"rs": [[partition, offset, key, value], ...]}  per poll, once its records are processed
//	{"committing": {"<partition>": offset}}      before a synchronous commit, {"commit": {...}} after it succeeded
//	{"commit_failed": "..."}, {"fetch_error": "..."}
//	{"joined": {"member": id, "generation": n}}, {"subscribed": "..."}  kafka-go's generations and the offsets each
//	                                             starts its partitions from (its own log lines, kept for a diagnosis)
//
// Commits are each client's own "last record received + 1" (franz-go's CommitUncommittedOffsets, kafka-go's
// CommitMessages, sarama's MarkMessage and Commit; sarama reports a failed commit on its error channel only, with
// its fetch errors: {"fetch_error": ...}). SIGTERM: the consumer leaves its group and the process exits 0.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

type args struct {
	client, bootstrap, topic, group, clientID, strategy string
	workMs                                              float64
	maxPollRecords                                      int
	commitIntervalS                                     float64
	sessionTimeoutMs                                    int
	pausedUntil                                         string
	// KIP-98's isolation level: "read_committed", or "" / "read_uncommitted" (each Go client's default)
	isolationLevel string
	// KIP-392: the client's rack, to fetch from a replica in it ("": the leader)
	clientRack string
	// a SASL/SCRAM-SHA-512 login ("": none), over plaintext: a locked-down cluster's, passed through Sluice
	saslUser, saslPassword string
}

func readCommitted(a args) bool { return a.isolationLevel == "read_committed" }

var out = json.NewEncoder(os.Stdout)
var outMu sync.Mutex

func emit(v any) {
	outMu.Lock()
	defer outMu.Unlock()
	if err := out.Encode(v); err != nil {
		os.Exit(1)
	}
}

func work(ms float64) {
	if ms > 0 {
		time.Sleep(time.Duration(ms * float64(time.Millisecond)))
	}
}

func text(b []byte) any {
	if b == nil {
		return nil
	}
	return string(b)
}

// pacer: synchronous commits at most every interval (0: after every poll) of the positions consumed since.
type pacer struct {
	interval time.Duration
	next     time.Time
	pending  map[string]int64
}

func (p *pacer) due() bool {
	now := time.Now()
	if now.Before(p.next) {
		return false
	}
	p.next = now.Add(p.interval)
	return true
}

func (p *pacer) snapshot() map[string]int64 {
	c := make(map[string]int64, len(p.pending))
	for k, v := range p.pending {
		c[k] = v
	}
	return c
}

func runFranz(ctx context.Context, a args) error {
	balancers := map[string]kgo.GroupBalancer{"range": kgo.RangeBalancer(), "roundrobin": kgo.RoundRobinBalancer(),
		"cooperative-sticky": kgo.CooperativeStickyBalancer()}
	b, ok := balancers[a.strategy]
	if !ok {
		return fmt.Errorf("unknown strategy %q", a.strategy)
	}
	var heldMu sync.Mutex
	var held map[string][]int32 // the last assignment (reported again as resumed)
	isolation := kgo.ReadUncommitted()
	if readCommitted(a) {
		isolation = kgo.ReadCommitted()
	}
	var login []kgo.Opt
	if a.saslUser != "" {
		login = append(login, kgo.SASL(scram.Auth{User: a.saslUser, Pass: a.saslPassword}.AsSha512Mechanism()))
	}
	cl, err := kgo.NewClient(append(login,
		kgo.FetchIsolationLevel(isolation), kgo.Rack(a.clientRack), kgo.SeedBrokers(a.bootstrap), kgo.ClientID(a.clientID), kgo.ConsumerGroup(a.group), kgo.ConsumeTopics(a.topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond), kgo.Balancers(b),
		kgo.SessionTimeout(time.Duration(a.sessionTimeoutMs)*time.Millisecond),
		kgo.HeartbeatInterval(500*time.Millisecond),
		kgo.OnPartitionsAssigned(func(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
			emit(map[string]any{"assigned": sorted(assigned)})
			heldMu.Lock()
			held = assigned
			heldMu.Unlock()
			if len(cl.PauseFetchTopics()) > 0 {
				emit(map[string]any{"paused": sorted(assigned)}) // the whole topic is paused: these with it
			}
		}),
	)...)
	if err != nil {
		return err
	}
	defer cl.Close() // leaves the group
	gated := a.pausedUntil != ""
	if gated {
		cl.PauseFetchTopics(a.topic) // before the first join: nothing of it is fetched until the gate opens
	}
	p := &pacer{interval: time.Duration(a.commitIntervalS * float64(time.Second)), pending: map[string]int64{}}
	for ctx.Err() == nil {
		if gated {
			if _, err := os.Stat(a.pausedUntil); err == nil {
				gated = false
				cl.ResumeFetchTopics(a.topic)
				heldMu.Lock()
				emit(map[string]any{"resumed": sorted(held)})
				heldMu.Unlock()
			}
		}
		pollCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		fetches := cl.PollRecords(pollCtx, a.maxPollRecords)
		cancel()
		fetches.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				emit(map[string]any{"fetch_error": err.Error()})
			}
		})
		records := [][]any{}
		fetches.EachRecord(func(r *kgo.Record) {
			work(a.workMs)
			records = append(records, []any{r.Partition, r.Offset, text(r.Key), text(r.Value)})
			p.pending[strconv.Itoa(int(r.Partition))] = r.Offset + 1
		})
		if len(records) == 0 {
			continue
		}
		emit(map[string]any{"rs": records})
		if !p.due() {
			continue
		}
		emit(map[string]any{"committing": p.snapshot()})
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			emit(map[string]any{"commit_failed": err.Error()})
			continue
		}
		emit(map[string]any{"commit": p.snapshot()})
		p.pending = map[string]int64{}
	}
	return nil
}

func runKafkaGo(ctx context.Context, a args) error {
	balancers := map[string]kafka.GroupBalancer{"range": kafka.RangeGroupBalancer{},
		"roundrobin": kafka.RoundRobinGroupBalancer{}}
	b, ok := balancers[a.strategy]
	if !ok {
		return fmt.Errorf("unknown strategy %q", a.strategy)
	}
	isolation := kafka.ReadUncommitted
	if readCommitted(a) {
		isolation = kafka.ReadCommitted
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: []string{a.bootstrap}, GroupID: a.group, Topic: a.topic, IsolationLevel: isolation,
		Dialer:         &kafka.Dialer{ClientID: a.clientID, Timeout: 10 * time.Second, DualStack: true},
		GroupBalancers: []kafka.GroupBalancer{b}, StartOffset: kafka.FirstOffset, MaxWait: 200 * time.Millisecond,
		SessionTimeout: time.Duration(a.sessionTimeoutMs) * time.Millisecond, HeartbeatInterval: 500 * time.Millisecond,
		MinBytes: 1, MaxBytes: 1 << 20,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			emit(map[string]any{"fetch_error": fmt.Sprintf(msg, args...)})
		}),
		// kafka-go says nothing of its rebalances but in its log: a generation joined (ConsumerGroup.joinGroup) and
		// the offsets its partitions restart from (Reader.subscribe); the rest of its log is left out
		Logger: kafka.LoggerFunc(func(msg string, args ...any) {
			switch {
			case strings.HasPrefix(msg, "joined group") && len(args) == 3:
				emit(map[string]any{"joined": map[string]any{"member": args[1], "generation": args[2]}})
			case strings.HasPrefix(msg, "subscribed to topics and partitions"):
				emit(map[string]any{"subscribed": fmt.Sprint(args...)})
			}
		}),
	})
	defer r.Close()
	p := &pacer{interval: time.Duration(a.commitIntervalS * float64(time.Second)), pending: map[string]int64{}}
	var held []kafka.Message
	for ctx.Err() == nil {
		// a "poll": the first message waited for up to 200 ms, then those already fetched
		var polled []kafka.Message
		wait := 200 * time.Millisecond
		for len(polled) < a.maxPollRecords {
			fctx, cancel := context.WithTimeout(ctx, wait)
			m, err := r.FetchMessage(fctx)
			cancel()
			if err != nil {
				break
			}
			polled = append(polled, m)
			wait = 5 * time.Millisecond
		}
		if len(polled) == 0 {
			continue
		}
		records := make([][]any, 0, len(polled))
		for _, m := range polled {
			work(a.workMs)
			records = append(records, []any{m.Partition, m.Offset, text(m.Key), text(m.Value)})
			p.pending[strconv.Itoa(m.Partition)] = m.Offset + 1
		}
		emit(map[string]any{"rs": records})
		held = append(held, polled...)
		if !p.due() {
			continue
		}
		emit(map[string]any{"committing": p.snapshot()})
		if err := r.CommitMessages(ctx, held...); err != nil {
			emit(map[string]any{"commit_failed": err.Error()})
			continue
		}
		emit(map[string]any{"commit": p.snapshot()})
		p.pending = map[string]int64{}
		held = nil
	}
	return nil
}

// saramaHandler consumes each claimed partition in its own goroutine (sarama's ConsumerGroupHandler), with the
// same polls and commits as the other runners.
type saramaHandler struct {
	a  args
	mu sync.Mutex // the pacer, across the claims' goroutines
	p  *pacer
}

func (h *saramaHandler) Setup(s sarama.ConsumerGroupSession) error {
	emit(map[string]any{"assigned": sorted(s.Claims())})
	return nil
}

func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *saramaHandler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	messages := claim.Messages()
	for {
		// a "poll": the first message waited for up to 200 ms, then those already fetched
		var polled []*sarama.ConsumerMessage
		timer := time.NewTimer(200 * time.Millisecond)
	poll:
		for len(polled) < h.a.maxPollRecords {
			select {
			case m, ok := <-messages:
				if !ok {
					timer.Stop()
					return nil // the claim ends: a rebalance, or the session closes
				}
				polled = append(polled, m)
				if len(polled) == 1 {
					timer.Reset(5 * time.Millisecond)
				}
			case <-timer.C:
				break poll
			case <-s.Context().Done():
				timer.Stop()
				return nil
			}
		}
		timer.Stop()
		if len(polled) == 0 {
			continue
		}
		records := make([][]any, 0, len(polled))
		for _, m := range polled {
			work(h.a.workMs)
			records = append(records, []any{m.Partition, m.Offset, text(m.Key), text(m.Value)})
			s.MarkMessage(m, "")
		}
		h.mu.Lock()
		emit(map[string]any{"rs": records})
		for _, m := range polled {
			h.p.pending[strconv.Itoa(int(m.Partition))] = m.Offset + 1
		}
		if h.p.due() {
			emit(map[string]any{"committing": h.p.snapshot()})
			s.Commit() // synchronous with auto-commit off; a failure goes to the group's error channel
			emit(map[string]any{"commit": h.p.snapshot()})
			h.p.pending = map[string]int64{}
		}
		h.mu.Unlock()
	}
}

func runSarama(ctx context.Context, a args) error {
	strategies := map[string]sarama.BalanceStrategy{"range": sarama.NewBalanceStrategyRange(),
		"roundrobin": sarama.NewBalanceStrategyRoundRobin()}
	strategy, ok := strategies[a.strategy]
	if !ok {
		return fmt.Errorf("unknown strategy %q", a.strategy)
	}
	cfg := sarama.NewConfig()
	cfg.ClientID = a.clientID
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.MaxWaitTime = 200 * time.Millisecond
	cfg.Consumer.Return.Errors = true
	if readCommitted(a) {
		cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	cfg.RackID = a.clientRack
	cfg.Consumer.Group.Session.Timeout = time.Duration(a.sessionTimeoutMs) * time.Millisecond
	cfg.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{strategy}
	group, err := sarama.NewConsumerGroup([]string{a.bootstrap}, a.group, cfg)
	if err != nil {
		return err
	}
	defer group.Close() // leaves the group
	go func() {
		for err := range group.Errors() { // fetches' and commits' alike: sarama's channel does not tell them apart
			emit(map[string]any{"fetch_error": err.Error()})
		}
	}()
	h := &saramaHandler{a: a, p: &pacer{interval: time.Duration(a.commitIntervalS * float64(time.Second)),
		pending: map[string]int64{}}}
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{a.topic}, h); err != nil && ctx.Err() == nil {
			emit(map[string]any{"fetch_error": err.Error()})
		}
	}
	return nil
}

func sorted(assigned map[string][]int32) [][]any {
	var tps [][]any
	for t, ps := range assigned {
		for _, p := range ps {
			tps = append(tps, []any{t, p})
		}
	}
	sort.Slice(tps, func(i, j int) bool {
		if tps[i][0].(string) != tps[j][0].(string) {
			return tps[i][0].(string) < tps[j][0].(string)
		}
		return tps[i][1].(int32) < tps[j][1].(int32)
	})
	if tps == nil {
		tps = [][]any{}
	}
	return tps
}

func main() {
	var a args
	flag.StringVar(&a.client, "client", "franz-go", "franz-go, kafka-go or sarama")
	flag.StringVar(&a.bootstrap, "bootstrap", "", "host:port")
	flag.StringVar(&a.topic, "topic", "", "")
	flag.StringVar(&a.group, "group", "", "")
	flag.StringVar(&a.clientID, "client-id", "", "")
	flag.StringVar(&a.strategy, "strategy", "range", "range, roundrobin, cooperative-sticky (franz-go)")
	flag.Float64Var(&a.workMs, "work-ms", 0, "per-record work, a wait")
	flag.IntVar(&a.maxPollRecords, "max-poll-records", 100, "")
	flag.Float64Var(&a.commitIntervalS, "commit-interval-s", 0, "commit at most this often (0: after every poll)")
	flag.IntVar(&a.sessionTimeoutMs, "session-timeout-ms", 6000, "")
	flag.StringVar(&a.pausedUntil, "paused-until", "", "keep the topic paused until this file exists (franz-go)")
	flag.StringVar(&a.isolationLevel, "isolation-level", "", "read_uncommitted or read_committed (default: the client's)")
	flag.StringVar(&a.clientRack, "client-rack", "", "KIP-392: the client's rack (franz-go, sarama)")
	flag.StringVar(&a.saslUser, "sasl-user", "", "a SASL/SCRAM-SHA-512 login over plaintext (franz-go)")
	flag.StringVar(&a.saslPassword, "sasl-password", "", "the -sasl-user's password")
	flag.Parse()
	if a.saslUser != "" && a.client != "franz-go" {
		fmt.Fprintln(os.Stderr, "-sasl-user: franz-go only")
		os.Exit(2)
	}
	if a.clientRack != "" && a.client == "kafka-go" {
		fmt.Fprintln(os.Stderr, "-client-rack: franz-go and sarama only (kafka-go's reader has no rack)")
		os.Exit(2)
	}
	if a.isolationLevel != "" && a.isolationLevel != "read_committed" && a.isolationLevel != "read_uncommitted" {
		fmt.Fprintf(os.Stderr, "-isolation-level: read_uncommitted or read_committed, not %q\n", a.isolationLevel)
		os.Exit(2)
	}
	if a.pausedUntil != "" && a.client != "franz-go" {
		fmt.Fprintln(os.Stderr, "-paused-until: franz-go only")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	run := map[string]func(context.Context, args) error{"franz-go": runFranz, "kafka-go": runKafkaGo,
		"sarama": runSarama}[a.client]
	if run == nil {
		fmt.Fprintf(os.Stderr, "unknown client %q\n", a.client)
		os.Exit(2)
	}
	if err := run(ctx, a); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
