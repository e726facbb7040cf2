package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// pgCounters are the server's own cumulative counters. Transactions are per
// database; WAL, full page images and checkpoints are cluster-wide, so
// anything else the cluster does during a phase shows up in them too
// (othersXacts and checkpoints say how much). After every checkpoint the
// first change to each page writes the whole page to the WAL, so frequent
// checkpoints (every DROP DATABASE requests one) inflate the WAL of a
// workload that touches many pages far more than one that appends.
type pgCounters struct {
	xacts       int64 // xact_commit + xact_rollback of the measured database
	othersXacts int64 // the same, summed over every other database
	walBytes    int64 // pg_current_wal_lsn as a byte position
	walFPI      int64 // full page images written (pg_stat_wal)
	checkpoints int64 // timed + requested
}

func (a pgCounters) sub(b pgCounters) pgCounters {
	return pgCounters{
		xacts: a.xacts - b.xacts, othersXacts: a.othersXacts - b.othersXacts,
		walBytes: a.walBytes - b.walBytes, walFPI: a.walFPI - b.walFPI, checkpoints: a.checkpoints - b.checkpoints,
	}
}

// readPG reads the counters for database db through obs, a connection to
// another database so that reading does not count as the measured database's
// transactions.
func readPG(ctx context.Context, obs *pgxpool.Pool, db string) (pgCounters, error) {
	var c pgCounters
	err := obs.QueryRow(ctx, `
		SELECT
			coalesce(sum(xact_commit + xact_rollback) FILTER (WHERE datname = $1), 0)::bigint,
			coalesce(sum(xact_commit + xact_rollback) FILTER (WHERE datname IS DISTINCT FROM $1), 0)::bigint,
			(pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint,
			(SELECT wal_fpi FROM pg_stat_wal),
			(SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter)
		FROM pg_stat_database`, db).Scan(&c.xacts, &c.othersXacts, &c.walBytes, &c.walFPI, &c.checkpoints)
	if err != nil {
		return c, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	return c, nil
}

// rowWrites are a table's cumulative row counts from pg_stat_user_tables:
// inserted, updated (hot of them without touching an index), deleted. How
// many times a delivery rewrites its rows, and how many of those rewrites
// leave the indexes alone, is where a ledger's WAL comes from.
type rowWrites struct {
	ins, upd, hot, del int64
}

type tableWrites map[string]rowWrites

// sub is what each table had written between b and a; tables with nothing
// written are left out.
func (a tableWrites) sub(b tableWrites) tableWrites {
	out := tableWrites{}
	for name, w := range a {
		p := b[name]
		d := rowWrites{ins: w.ins - p.ins, upd: w.upd - p.upd, hot: w.hot - p.hot, del: w.del - p.del}
		if d != (rowWrites{}) {
			out[name] = d
		}
	}
	return out
}

// commandStats are Redis's per-command call counts (INFO commandstats).
// Commands a Lua script runs are counted under their own names as well as
// the EVALSHA that ran them, so the total is not a count of round trips; the
// breakdown shows which is which.
type commandStats map[string]int64

// parseCommandStats reads the output of INFO commandstats, lines such as
// cmdstat_evalsha:calls=3,usec=120,usec_per_call=40.00,rejected_calls=0,failed_calls=0
func parseCommandStats(info string) (commandStats, error) {
	out := commandStats{}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls := -1
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					return nil, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				calls = n
			}
		}
		if calls < 0 {
			return nil, fmt.Errorf("INFO commandstats: no calls= in %q", line)
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = int64(calls)
	}
	return out, nil
}

// sub is what was called between b and a, leaving out INFO itself (this tool
// calls it) and commands not called in between.
func (a commandStats) sub(b commandStats) commandStats {
	out := commandStats{}
	for name, n := range a {
		if name == "info" {
			continue
		}
		if d := n - b[name]; d > 0 {
			out[name] = d
		}
	}
	return out
}

func (s commandStats) total() int64 {
	var t int64
	for _, n := range s {
		t += n
	}
	return t
}

func readRedis(ctx context.Context, rdb *redis.Client) (commandStats, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	return parseCommandStats(info)
}

// procStatus reads a kB field such as VmHWM or VmRSS from /proc/PID/status,
// in bytes.
func procStatus(pid int, field string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	return parseStatusField(string(b), field)
}

func parseStatusField(status, field string) (int64, error) {
	for line := range strings.Lines(status) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status %s: unexpected %q", field, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status %s: %w", field, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc status has no %s", field)
}

// resetPeakRSS makes VmHWM start again from the current RSS, so that each
// phase reports its own peak (Linux 4.0 and later; only for a process this
// user may write to).
func resetPeakRSS(pid int) error {
	return os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "clear_refs"), []byte("5"), 0)
}

// clockTicks is USER_HZ, the unit of the CPU times in /proc: 100 on every
// Linux architecture Go runs on.
const clockTicks = 100

// parseProcStat reads the command name and utime+stime from a /proc/PID/stat
// line. The name is in parentheses and may itself hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseProcStat(stat string) (comm string, ticks int64, err error) {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("/proc stat: no command name in %q", stat)
	}
	comm = stat[open+1 : end]
	// After the name: state(3) ppid(4) ... utime(14) stime(15).
	f := strings.Fields(stat[end+1:])
	if len(f) < 13 {
		return comm, 0, fmt.Errorf("/proc stat: %d fields after the name", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return comm, 0, fmt.Errorf("/proc stat: utime %q stime %q", f[11], f[12])
	}
	return comm, u + s, nil
}

// cpuSnapshot is the CPU time used so far by the processes that share the
// machine during a phase.
type cpuSnapshot struct {
	machineBusy, machineTotal int64          // /proc/stat, all CPUs
	byPID                     map[int]int64  // every process
	commOf                    map[int]string // their names
	self                      int64          // this process
}

func readCPU() (cpuSnapshot, error) {
	s := cpuSnapshot{byPID: map[int]int64{}, commOf: map[int]string{}}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, err
	}
	if s.machineBusy, s.machineTotal, err = parseMachineStat(string(b)); err != nil {
		return s, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return s, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone in the meantime
		}
		comm, ticks, err := parseProcStat(string(b))
		if err != nil {
			continue
		}
		s.byPID[pid], s.commOf[pid] = ticks, comm
	}
	s.self = s.byPID[os.Getpid()]
	return s, nil
}

// parseMachineStat reads the aggregate "cpu" line of /proc/stat: busy is
// everything but idle and iowait.
func parseMachineStat(stat string) (busy, total int64, err error) {
	sc := bufio.NewScanner(strings.NewReader(stat))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[0] != "cpu" {
			continue
		}
		for i, v := range f[1:] {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat cpu: %q", v)
			}
			// user nice system idle iowait irq softirq steal guest guest_nice;
			// guest times are already inside user and nice.
			if i >= 8 {
				break
			}
			total += n
			if i != 3 && i != 4 {
				busy += n
			}
		}
		return busy, total, nil
	}
	return 0, 0, fmt.Errorf("/proc/stat has no cpu line")
}

// cpuUse is the CPU time spent between two snapshots, in clock ticks.
type cpuUse struct {
	machineBusy, machineTotal int64
	gateway, postgres, redis  int64
	self                      int64
}

// cpuBetween attributes CPU time between a and b. Processes that started in
// between count from zero; those that ended in between are lost, which is
// why the end snapshot is taken before any connection is closed.
func cpuBetween(a, b cpuSnapshot, gatewayPID, redisPID int) cpuUse {
	u := cpuUse{machineBusy: b.machineBusy - a.machineBusy, machineTotal: b.machineTotal - a.machineTotal, self: b.self - a.self}
	for pid, t := range b.byPID {
		d := t - a.byPID[pid]
		switch {
		case pid == gatewayPID:
			u.gateway += d
		case pid == redisPID:
			u.redis += d
		case b.commOf[pid] == "postgres":
			u.postgres += d
		}
	}
	return u
}
