package drill

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Netns is a network namespace joined to this host by a veth pair: a
// second host for a gateway. This host's end of the link carries three
// addresses, one per service the namespace reaches (the downstream,
// Redis, Postgres), so that a partition can cut one and not the others: a
// blackhole route in the namespace drops everything it sends to that
// address, and a connection across it hears nothing, as across a real
// partition. (Routes rather than packet filters: this needs no netfilter
// or tc classifier in the kernel.)
type Netns struct {
	Name string
	// NSIP is the namespace's address; Downstream, Redis and Postgres are
	// this host's addresses for each service.
	NSIP, Downstream, Redis, Postgres string
	hostDev, nsDev                    string
	cut                               []string
}

// NewNetns creates namespace name on the link 10.<net>.0.0/24: .1, .3 and
// .4 here (downstream, Redis, Postgres), .2 there. It needs root and
// iproute2.
func NewNetns(name string, net int) (_ *Netns, err error) {
	ip := func(last int) string { return fmt.Sprintf("10.%d.0.%d", net, last) }
	n := &Netns{
		Name: name, NSIP: ip(2), Downstream: ip(1), Redis: ip(3), Postgres: ip(4),
		hostDev: "ackv" + strconv.Itoa(net) + "h", nsDev: "ackv" + strconv.Itoa(net) + "n",
	}
	_ = n.run("ip", "netns", "del", name) // left over from an interrupted drill
	_ = n.run("ip", "link", "del", n.hostDev)
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	steps := [][]string{
		{"ip", "netns", "add", name},
		{"ip", "link", "add", n.hostDev, "type", "veth", "peer", "name", n.nsDev},
		{"ip", "link", "set", n.nsDev, "netns", name},
	}
	for _, a := range []string{n.Downstream, n.Redis, n.Postgres} {
		steps = append(steps, []string{"ip", "addr", "add", a + "/24", "dev", n.hostDev})
	}
	steps = append(steps,
		[]string{"ip", "link", "set", n.hostDev, "up"},
		[]string{"ip", "netns", "exec", name, "ip", "addr", "add", n.NSIP + "/24", "dev", n.nsDev},
		[]string{"ip", "netns", "exec", name, "ip", "link", "set", n.nsDev, "up"},
		[]string{"ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"},
	)
	for _, args := range steps {
		if err := n.run(args...); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Prefix runs a command inside the namespace.
func (n *Netns) Prefix() []string { return []string{"ip", "netns", "exec", n.Name} }

// Partition cuts the namespace off from addrs (some of Downstream, Redis,
// Postgres).
func (n *Netns) Partition(addrs ...string) error {
	for _, a := range addrs {
		if err := n.run("ip", "netns", "exec", n.Name, "ip", "route", "add", "blackhole", a+"/32"); err != nil {
			return err
		}
		n.cut = append(n.cut, a)
	}
	return nil
}

// Heal removes every partition.
func (n *Netns) Heal() error {
	for len(n.cut) > 0 {
		a := n.cut[len(n.cut)-1]
		if err := n.run("ip", "netns", "exec", n.Name, "ip", "route", "del", "blackhole", a+"/32"); err != nil {
			return err
		}
		n.cut = n.cut[:len(n.cut)-1]
	}
	return nil
}

// Close removes the namespace and the link.
func (n *Netns) Close() {
	_ = n.run("ip", "link", "del", n.hostDev)
	_ = n.run("ip", "netns", "del", n.Name)
}

func (n *Netns) run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
