package main

import (
	"io"
	"log/slog"

	"github.com/ackgate/ackgate/config"
	"github.com/ackgate/ackgate/internal/logsetup"
	"github.com/ackgate/ackgate/telemetry"
)

// processLogger is serve's one log stream: GATEWAY_LOG_FORMAT's format at
// GATEWAY_LOG_LEVEL, every record stamped with its span's trace and span
// ids, and the libraries' own lines routed into it (logsetup.Adopt).
func processLogger(w io.Writer, s config.Settings) (*slog.Logger, error) {
	h, err := logsetup.NewHandler(w, s.LogFormat, s.LogLevel)
	if err != nil {
		return nil, err
	}
	log := slog.New(telemetry.LogHandler(h))
	logsetup.Adopt(log)
	return log, nil
}

// logFailure reports the error serve stopped with as a record of the same
// stream, so the last line a log shipper reads parses like the others.
// The settings may be what failed, so the format is read as it stands.
func logFailure(w io.Writer, getenv func(string) string, err error) {
	log, lerr := logsetup.New(w, getenv(config.EnvPrefix+"_LOG_FORMAT"), slog.LevelInfo)
	if lerr != nil {
		log, _ = logsetup.New(w, logsetup.FormatJSON, slog.LevelInfo)
	}
	log.Error("gateway stopped", "err", err)
}
