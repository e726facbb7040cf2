package storage

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ackgate/ackgate/internal/testenv"
)

// The text arrays the write path sends where the server describes each
// statement's parameters reach the server as the strings they hold, byte
// for byte, with nil elements as NULL. (In the modes where pgx names the
// types itself the write path sends plain slices: TestCommonPathInEveryQueryMode.)
func TestTextArraysReachTheServerAsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	values := []string{"", "plain", "a,b", `"quoted"`, `back\slash`, "{braces}", "NULL", "ünïcödé", "tab\there"}
	nullable := make([]*string, 0, len(values)+1)
	nullable = append(nullable, nil)
	for i := range values {
		nullable = append(nullable, &values[i])
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec} {
		var got []string
		var gotNull []*string
		var nulls []bool
		err := conn.QueryRow(ctx, `SELECT $1::text[], $2::text[], array(SELECT x IS NULL FROM unnest($2::text[]) AS x)`,
			mode, textArray(values), nullTextArray(nullable)).Scan(&got, &gotNull, &nulls)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if !slices.Equal(got, values) {
			t.Errorf("mode %v: text[] came back %q, want %q", mode, got, values)
		}
		if len(gotNull) != len(nullable) || gotNull[0] != nil || !nulls[0] {
			t.Fatalf("mode %v: nullable text[] came back %v (nulls %v), want a NULL first", mode, gotNull, nulls)
		}
		for i, v := range gotNull[1:] {
			if v == nil || *v != values[i] || nulls[i+1] {
				t.Errorf("mode %v: element %d came back %v, want %q", mode, i+1, v, values[i])
			}
		}
	}
	// Nothing sends an empty or nil one today; they encode as pgx's own
	// slices do.
	var empty []string
	if err := conn.QueryRow(ctx, `SELECT $1::text[]`, textArray{}).Scan(&empty); err != nil || empty == nil || len(empty) != 0 {
		t.Errorf("an empty textArray came back %v, %v; want an empty array", empty, err)
	}
	var isNull bool
	if err := conn.QueryRow(ctx, `SELECT $1::text[] IS NULL`, textArray(nil)).Scan(&isNull); err != nil || !isNull {
		t.Errorf("a nil textArray: NULL %v, %v; want NULL", isNull, err)
	}
}
