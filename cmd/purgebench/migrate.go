package main

import (
	"context"

	"github.com/ackgate/ackgate/storage"
)

func migrate(ctx context.Context, dbURL string) error { return storage.Migrate(ctx, dbURL) }
