package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Etcd is a single etcd member, Patroni's store of who leads.
type Etcd struct {
	URL  string
	proc *proc
	log  *os.File
}

// StartEtcd runs a one-member etcd with its data in dir.
func StartEtcd(ctx context.Context, dir string) (*Etcd, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, errors.New("etcd not found: apt-get install etcd-server")
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	log, err := openLog(dir, "etcd.log")
	if err != nil {
		return nil, err
	}
	client, peer := "http://"+addr(ports[0]), "http://"+addr(ports[1])
	p, err := startProc("etcd", log, nil, bin, "--name", "drill", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "drill="+peer)
	if err != nil {
		log.Close()
		return nil, err
	}
	e := &Etcd{URL: client, proc: p, log: log}
	if err := waitFor(ctx, "etcd", 30*time.Second, func() error {
		resp, err := http.Get(client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health %s", resp.Status)
		}
		return nil
	}); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close stops etcd.
func (e *Etcd) Close() {
	e.proc.stop(syscall.SIGTERM, 10*time.Second)
	e.log.Close()
}

// Patroni is two Postgres nodes under Patroni: one leads (the primary), the
// other streams from it. A leader whose key in etcd lapses (ttl 10 s) is
// replaced by the replica.
type Patroni struct {
	dir   string
	sync  bool
	nodes []*patroniNode
	cred  *syscall.Credential
	log   *os.File
	http  *http.Client
}

type patroniNode struct {
	name    string
	api     string // http://host:port
	pgPort  int
	dataDir string
	config  string
	proc    *proc
}

// PatroniTTL is the leader key's time to live: a primary that dies unseen
// is replaced within about this long.
const PatroniTTL = 10 * time.Second

// StartPatroni bootstraps the first node, waits until it leads, then starts
// the second as its replica and waits until it streams. Postgres and
// Patroni run as the postgres user when the drill runs as root. With sync,
// Patroni's synchronous mode: a commit returns once the replica has it, and
// only that replica is promoted, so a failover loses no acknowledged
// commit; without it, replication is asynchronous and a primary's death
// loses what the replica had not received.
func StartPatroni(ctx context.Context, dir, etcdURL, pgBinDir string, sync bool) (_ *Patroni, err error) {
	if _, err := exec.LookPath("patroni"); err != nil {
		return nil, errors.New("patroni not found: apt-get install patroni")
	}
	cred, err := postgresUser()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "patroni")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	log, err := openLog(dir, "patroni.log")
	if err != nil {
		return nil, err
	}
	p := &Patroni{dir: root, sync: sync, cred: cred, log: log, http: &http.Client{Timeout: 5 * time.Second}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	etcdHost := strings.TrimPrefix(etcdURL, "http://")
	for i := range 2 {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		n := &patroniNode{name: "pg" + strconv.Itoa(i+1), api: "http://" + addr(ports[0]), pgPort: ports[1],
			dataDir: filepath.Join(root, "data"+strconv.Itoa(i+1)), config: filepath.Join(root, "pg"+strconv.Itoa(i+1)+".yml")}
		if err := os.WriteFile(n.config, []byte(patroniConfig(n, ports[0], etcdHost, root, pgBinDir, sync)), 0o600); err != nil {
			return nil, err
		}
		if cred != nil {
			if err := os.Chown(n.config, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
		p.nodes = append(p.nodes, n)
		if err := p.start(n); err != nil {
			return nil, err
		}
		if err := p.waitCluster(ctx, i+1); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// patroniConfig is one node's configuration: trust authentication on
// loopback, a replicator role, pg_rewind so a demoted primary can follow
// the new one, and a short leader TTL so a failover happens within a
// drill.
func patroniConfig(n *patroniNode, apiPort int, etcdHost, root, pgBinDir string, sync bool) string {
	return fmt.Sprintf(`scope: ackgate-drill
namespace: /ackgate-drill/
name: %[1]s
restapi:
  listen: 127.0.0.1:%[2]d
  connect_address: 127.0.0.1:%[2]d
etcd3:
  hosts: %[3]s
bootstrap:
  dcs:
    ttl: %[8]d
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[9]t
    postgresql:
      use_pg_rewind: true
      parameters:
        wal_log_hints: "on"
        max_connections: 100
  initdb:
    - encoding: UTF8
    - locale: C
    - auth: trust
  pg_hba:
    - local all all trust
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:%[4]d
  connect_address: 127.0.0.1:%[4]d
  data_dir: %[5]s
  bin_dir: %[6]s
  pgpass: %[7]s/pgpass-%[1]s
  authentication:
    replication: {username: replicator, password: replicator}
    superuser: {username: postgres, password: postgres}
    rewind: {username: rewinder, password: rewinder}
  parameters:
    unix_socket_directories: %[7]s
`, n.name, apiPort, etcdHost, n.pgPort, n.dataDir, pgBinDir, root, int(PatroniTTL/time.Second), sync)
}

func (p *Patroni) start(n *patroniNode) error {
	bin, err := exec.LookPath("patroni")
	if err != nil {
		return err
	}
	n.proc, err = startProc("patroni "+n.name, p.log, p.cred, bin, n.config)
	return err
}

// member is one node as Patroni's /cluster lists it.
type member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`
	State string `json:"state"`
	Port  int    `json:"port"`
}

// cluster asks any node's API for the members.
func (p *Patroni) cluster(ctx context.Context) ([]member, error) {
	var lastErr error
	for _, n := range p.nodes {
		if n.proc == nil || !n.proc.running() {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.api+"/cluster", nil)
		if err != nil {
			return nil, err
		}
		resp, err := p.http.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		var body struct {
			Members []member `json:"members"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		return body.Members, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no Patroni node is running")
	}
	return nil, lastErr
}

// Leader is the name of the node that leads now.
func (p *Patroni) Leader(ctx context.Context) (string, error) {
	ms, err := p.cluster(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return m.Name, nil
		}
	}
	return "", errors.New("no running leader")
}

// waitCluster waits until there is a running leader and running replicas,
// want members in all, and in synchronous mode one of them the leader's
// synchronous standby: until then the leader's death would leave no node
// Patroni may promote.
func (p *Patroni) waitCluster(ctx context.Context, want int) error {
	return waitFor(ctx, "patroni cluster", 3*time.Minute, func() error {
		ms, err := p.cluster(ctx)
		if err != nil {
			return err
		}
		leaders, running, syncs := 0, 0, 0
		for _, m := range ms {
			if m.State == "running" || m.State == "streaming" {
				running++
				switch m.Role {
				case "leader":
					leaders++
				case "sync_standby":
					syncs++
				}
			}
		}
		if leaders != 1 || running != want || (p.sync && want > 1 && syncs != 1) {
			return fmt.Errorf("%d leaders, %d synchronous standbys, %d of %d members running: %+v", leaders, syncs, running, want, ms)
		}
		return nil
	})
}

// URL is the gateway's database URL: every node, with
// target_session_attrs=read-write so a connection reaches whichever is the
// primary now, as libpq and pgx resolve it.
func (p *Patroni) URL(db string) string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = addr(n.pgPort)
	}
	sort.Strings(hosts)
	q := url.Values{"sslmode": {"disable"}, "target_session_attrs": {"read-write"}, "connect_timeout": {"2"}}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + db + "?" + q.Encode()
}

// CreateDatabase makes an empty database on the primary and waits until
// every node has replayed it: a client tries the hosts of a multi-host URL
// in order, and stops at the first that says the database does not exist.
func (p *Patroni) CreateDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	conn.Close(ctx)
	if err != nil {
		return err
	}
	for _, n := range p.nodes {
		u := fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", addr(n.pgPort), name)
		if err := waitFor(ctx, "database "+name+" on "+n.name, time.Minute, func() error {
			c, err := pgx.Connect(ctx, u)
			if err != nil {
				return err
			}
			return c.Close(ctx)
		}); err != nil {
			return err
		}
	}
	return nil
}

// Switchover asks the leader to hand over to the replica (a planned
// switch: the primary is demoted cleanly, then follows the new one) and
// waits until both run again in their new roles.
func (p *Patroni) Switchover(ctx context.Context) error {
	leader, err := p.Leader(ctx)
	if err != nil {
		return err
	}
	var candidate string
	for _, n := range p.nodes {
		if n.name != leader {
			candidate = n.name
		}
	}
	body, _ := json.Marshal(map[string]string{"leader": leader, "candidate": candidate})
	var lastErr error
	for _, n := range p.nodes {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.api+"/switchover", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("switchover answered %s", resp.Status)
			continue
		}
		return waitFor(ctx, "switchover to "+candidate, 2*time.Minute, func() error {
			if l, err := p.Leader(ctx); err != nil || l != candidate {
				return fmt.Errorf("leader %q (%v)", l, err)
			}
			return p.waitCluster(ctx, len(p.nodes))
		})
	}
	return lastErr
}

// KillLeader is the leading node's death: SIGKILL of its Patroni and of its
// postmaster at once, no demotion. The replica takes over once the leader
// key lapses; the dead node stays down. It returns once the replica leads.
func (p *Patroni) KillLeader(ctx context.Context) (string, error) {
	leader, err := p.Leader(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range p.nodes {
		if n.name != leader {
			continue
		}
		pm := postmasterPID(n.dataDir)
		n.proc.stop(syscall.SIGKILL, 0)
		if pm > 0 {
			_ = syscall.Kill(pm, syscall.SIGKILL)
		}
		return leader, waitFor(ctx, "a new leader after "+leader, 2*time.Minute, func() error {
			l, err := p.Leader(ctx)
			if err != nil {
				return err
			}
			if l == leader {
				return errors.New("the dead node still leads")
			}
			return nil
		})
	}
	return "", fmt.Errorf("leader %s is not one of ours", leader)
}

// postmasterPID reads the postmaster's pid from its data directory; 0 when
// there is none.
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// Close stops each Patroni (which stops its Postgres), then kills any
// postmaster left behind.
func (p *Patroni) Close() {
	for _, n := range p.nodes {
		if n.proc != nil {
			n.proc.stop(syscall.SIGTERM, 30*time.Second)
		}
		if pm := postmasterPID(n.dataDir); pm > 0 {
			if syscall.Kill(pm, syscall.SIGQUIT) == nil {
				for range 50 {
					if syscall.Kill(pm, 0) != nil {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	}
	p.log.Close()
}
