package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisNode is one redis-server without persistence: a node that dies
// comes back empty, or not at all.
type redisNode struct {
	port int
	proc *proc
}

func (n *redisNode) addr() string { return addr(n.port) }

func startRedisNode(dir string, port int, log *os.File, extra ...string) (*redisNode, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not found: apt-get install redis-server")
	}
	nodeDir := filepath.Join(dir, "redis-"+strconv.Itoa(port))
	if err := os.MkdirAll(nodeDir, 0o755); err != nil {
		return nil, err
	}
	// A replica syncs at once rather than after the default 5 s wait for
	// more replicas.
	args := append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--repl-diskless-sync-delay", "0", "--dir", nodeDir}, extra...)
	p, err := startProc("redis-server "+strconv.Itoa(port), log, nil, args...)
	if err != nil {
		return nil, err
	}
	n := &redisNode{port: port, proc: p}
	c := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
	defer c.Close()
	if err := waitFor(context.Background(), "redis-server on "+n.addr(), 20*time.Second, func() error {
		if !p.running() {
			return errors.New("exited")
		}
		return c.Ping(context.Background()).Err()
	}); err != nil {
		p.stop(syscall.SIGKILL, 0)
		return nil, err
	}
	return n, nil
}

// RedisCluster is three primaries with a replica each. A primary's
// failure is noticed after the node timeout (2 s) and its replica is
// promoted.
type RedisCluster struct {
	nodes []*redisNode
	log   *os.File
}

// clusterNodeTimeout is cluster-node-timeout: how long a silent node takes
// to be failed over.
const clusterNodeTimeout = 2 * time.Second

// StartRedisCluster starts six nodes in dir and joins them.
func StartRedisCluster(ctx context.Context, dir string) (_ *RedisCluster, err error) {
	log, err := openLog(dir, "redis-cluster.log")
	if err != nil {
		return nil, err
	}
	c := &RedisCluster{log: log}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, p := range ports {
		n, err := startRedisNode(dir, p, log, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "redis-"+strconv.Itoa(p), "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout/time.Millisecond)))
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		addrs = append(addrs, n.addr())
	}
	create := exec.CommandContext(ctx, "redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "1", "--cluster-yes")...)
	if out, err := create.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitHealthy(ctx, 3); err != nil {
		return nil, err
	}
	// A replica that never completed its first sync cannot be promoted:
	// until each has, a primary's death would take its slots down for good.
	if err := waitReplicasSynced(ctx, c.nodes); err != nil {
		return nil, err
	}
	return c, nil
}

// waitReplicasSynced waits until every replica among nodes reports its link
// to its primary up.
func waitReplicasSynced(ctx context.Context, nodes []*redisNode) error {
	return waitFor(ctx, "replicas synced", 60*time.Second, func() error {
		for _, n := range nodes {
			c := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
			info, err := c.Info(ctx, "replication").Result()
			c.Close()
			if err != nil {
				return err
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %s has not synced with its primary yet", n.addr())
			}
		}
		return nil
	})
}

// Addrs are the nodes' addresses, the gateway's seeds.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// Client is a cluster client over every node.
func (c *RedisCluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
}

// clusterState asks a live node for cluster_state and the live primaries
// that serve slots.
func (c *RedisCluster) clusterState(ctx context.Context) (state string, primaries []string, err error) {
	for _, n := range c.nodes {
		if !n.proc.running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			cl.Close()
			continue
		}
		nodes, err := cl.ClusterNodes(ctx).Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "cluster_state:"); ok {
				state = v
			}
		}
		for _, l := range strings.Split(nodes, "\n") {
			f := strings.Fields(l)
			// id addr@bus flags master ping pong epoch link slots...
			if len(f) >= 9 && strings.Contains(f[2], "master") && !strings.Contains(f[2], "fail") {
				primaries = append(primaries, strings.Split(f[1], "@")[0])
			}
		}
		return state, primaries, nil
	}
	return "", nil, errors.New("no cluster node answers")
}

// waitHealthy waits until every running node says cluster_state ok and
// primaries primaries serve slots. Each node decides its cluster_state on
// its own, from the gossip it has received: one node's ok does not stop
// another from answering CLUSTERDOWN for a while.
func (c *RedisCluster) waitHealthy(ctx context.Context, primaries int) error {
	return waitFor(ctx, "redis cluster ok", 60*time.Second, func() error {
		state, p, err := c.clusterState(ctx)
		if err != nil {
			return err
		}
		if state != "ok" || len(p) != primaries {
			return fmt.Errorf("cluster_state %s with %d primaries serving slots", state, len(p))
		}
		for _, n := range c.nodes {
			if !n.proc.running() {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
			info, err := cl.ClusterInfo(ctx).Result()
			cl.Close()
			if err != nil {
				return fmt.Errorf("node %s: %w", n.addr(), err)
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("node %s does not see the cluster ok yet", n.addr())
			}
		}
		return nil
	})
}

// KillPrimary SIGKILLs one of the primaries and waits until the cluster
// has noticed (cluster_state fail, after the node timeout) and then
// promoted its replica (cluster_state ok again); it returns the killed
// node's address.
func (c *RedisCluster) KillPrimary(ctx context.Context) (string, error) {
	_, primaries, err := c.clusterState(ctx)
	if err != nil || len(primaries) == 0 {
		return "", fmt.Errorf("no primary to kill: %v", err)
	}
	victim := primaries[0]
	for _, n := range c.nodes {
		if n.addr() != victim {
			continue
		}
		n.proc.stop(syscall.SIGKILL, 0)
		if err := waitFor(ctx, "cluster notices "+victim+" failed", 60*time.Second, func() error {
			state, p, err := c.clusterState(ctx)
			if err != nil {
				return err
			}
			if state == "ok" && slices.Contains(p, victim) {
				return errors.New("not yet")
			}
			return nil
		}); err != nil {
			return victim, err
		}
		return victim, c.waitHealthy(ctx, 3)
	}
	return "", fmt.Errorf("primary %s is not one of ours", victim)
}

// Close kills every node.
func (c *RedisCluster) Close() {
	for _, n := range c.nodes {
		n.proc.stop(syscall.SIGKILL, 0)
	}
	if c.log != nil {
		c.log.Close()
	}
}

// Sentinel is a Redis primary and its replica under three Sentinels (quorum
// two) that fail over after 2 s of silence.
type Sentinel struct {
	Master    string
	data      []*redisNode
	sentinels []*redisNode
	log       *os.File
}

// StartSentinel starts the primary, the replica and the Sentinels in dir.
func StartSentinel(ctx context.Context, dir string) (_ *Sentinel, err error) {
	log, err := openLog(dir, "redis-sentinel.log")
	if err != nil {
		return nil, err
	}
	s := &Sentinel{Master: "drill-primary", log: log}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	primary, err := startRedisNode(dir, ports[0], log)
	if err != nil {
		return nil, err
	}
	s.data = append(s.data, primary)
	replica, err := startRedisNode(dir, ports[1], log, "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
	if err != nil {
		return nil, err
	}
	s.data = append(s.data, replica)
	if err := waitReplicasSynced(ctx, s.data); err != nil {
		return nil, err
	}
	for _, p := range ports[2:] {
		conf := filepath.Join(dir, "sentinel-"+strconv.Itoa(p)+".conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s 2000\nsentinel failover-timeout %s 20000\nsentinel parallel-syncs %s 1\n",
			p, s.Master, ports[0], s.Master, s.Master, s.Master)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			return nil, err
		}
		bin, err := exec.LookPath("redis-server")
		if err != nil {
			return nil, err
		}
		pr, err := startProc("redis-sentinel "+strconv.Itoa(p), log, nil, bin, conf, "--sentinel")
		if err != nil {
			return nil, err
		}
		s.sentinels = append(s.sentinels, &redisNode{port: p, proc: pr})
	}
	// Every Sentinel knows the primary and its replica.
	if err := waitFor(ctx, "sentinels", 60*time.Second, func() error {
		for _, sn := range s.sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: sn.addr(), MaxRetries: -1})
			reps, err := c.Replicas(ctx, s.Master).Result()
			c.Close()
			if err != nil {
				return err
			}
			if len(reps) != 1 {
				return fmt.Errorf("sentinel %s sees %d replicas", sn.addr(), len(reps))
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return s, nil
}

// Addrs are the Sentinels' addresses.
func (s *Sentinel) Addrs() []string {
	out := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		out[i] = n.addr()
	}
	return out
}

// primary asks a Sentinel which node is the primary now.
func (s *Sentinel) primary(ctx context.Context) (string, error) {
	var lastErr error
	for _, sn := range s.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sn.addr(), MaxRetries: -1})
		a, err := c.GetMasterAddrByName(ctx, s.Master).Result()
		c.Close()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
		lastErr = err
	}
	return "", lastErr
}

// Failover asks the Sentinels for a failover (the primary is healthy: a
// planned switch) and waits until the other node is primary and accepts
// writes.
func (s *Sentinel) Failover(ctx context.Context) error {
	before, err := s.primary(ctx)
	if err != nil {
		return err
	}
	c := redis.NewSentinelClient(&redis.Options{Addr: s.sentinels[0].addr()})
	err = c.Failover(ctx, s.Master).Err()
	c.Close()
	if err != nil {
		return err
	}
	return s.waitNewPrimary(ctx, before)
}

// KillPrimary SIGKILLs the primary and waits until the Sentinels have
// promoted the replica. The killed node stays down.
func (s *Sentinel) KillPrimary(ctx context.Context) error {
	before, err := s.primary(ctx)
	if err != nil {
		return err
	}
	for _, n := range s.data {
		if n.addr() == before {
			n.proc.stop(syscall.SIGKILL, 0)
			return s.waitNewPrimary(ctx, before)
		}
	}
	return fmt.Errorf("primary %s is not one of ours", before)
}

func (s *Sentinel) waitNewPrimary(ctx context.Context, before string) error {
	return waitFor(ctx, "sentinel failover", 60*time.Second, func() error {
		now, err := s.primary(ctx)
		if err != nil {
			return err
		}
		if now == before {
			return fmt.Errorf("primary still %s", before)
		}
		c := redis.NewClient(&redis.Options{Addr: now, MaxRetries: -1})
		defer c.Close()
		return c.Set(ctx, "drill:writable", "1", time.Minute).Err()
	})
}

// Close kills every process.
func (s *Sentinel) Close() {
	for _, n := range append(append([]*redisNode(nil), s.sentinels...), s.data...) {
		n.proc.stop(syscall.SIGKILL, 0)
	}
	if s.log != nil {
		s.log.Close()
	}
}
