package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// maxConsoleSessionTTL bounds a console login: a week covers any shift, and
// a stolen cookie is worth no more than that.
const maxConsoleSessionTTL = 7 * 24 * time.Hour

// checkConsole validates the console's settings.
func (s Settings) checkConsole() []error {
	var errs []error
	if s.ConsoleSessionTTL <= 0 || s.ConsoleSessionTTL > maxConsoleSessionTTL {
		errs = append(errs, fmt.Errorf("%s_CONSOLE_SESSION_TTL: must be positive and at most %s, got %s", EnvPrefix, maxConsoleSessionTTL, s.ConsoleSessionTTL))
	}
	if t := s.ConsoleTraceURL; t != "" {
		u, err := url.Parse(strings.ReplaceAll(t, "{trace_id}", "0"))
		switch {
		case !strings.Contains(t, "{trace_id}"):
			errs = append(errs, fmt.Errorf("%s_CONSOLE_TRACE_URL: must contain {trace_id}, where the trace id goes", EnvPrefix))
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			errs = append(errs, fmt.Errorf("%s_CONSOLE_TRACE_URL: must be an absolute http or https URL", EnvPrefix))
		}
	}
	return errs
}
